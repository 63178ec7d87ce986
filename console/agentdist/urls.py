from django.urls import path

from console.agentdist import views

urlpatterns = [
    path("install.sh", views.install_script, name="install-script"),
    path("agent/<str:filename>", views.agent_package, name="agent-package"),
]

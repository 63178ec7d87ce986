from django.contrib import admin
from django.urls import include, path

from console.web import urls as web_urls

urlpatterns = [
    path("api/v1/", include("api.urls")),
    path("admin/", admin.site.urls),
    path("", include("console.agentdist.urls")),
    path("", include(web_urls)),
]

from django.contrib import admin
from django.urls import include, path

from console.core.metrics import metrics_view
from console.web import urls as web_urls

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", include("api.urls")),
    path("admin/", admin.site.urls),
    path("", include("console.agentdist.urls")),
    path("", include(web_urls)),
]

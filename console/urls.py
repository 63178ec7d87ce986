from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from console.core.metrics import metrics_view
from console.web import urls as web_urls

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", include("api.urls")),
    path("", include("console.agentdist.urls")),
    path("", include(web_urls)),
]
if settings.ADMIN_ENABLED:  # off unless LOCKSTEP_ADMIN=true (console/settings.py)
    urlpatterns.insert(2, path("admin/", admin.site.urls))

handler404 = "api.errors.not_found"

from django.contrib.auth import views as auth_views
from django.urls import path

from console.jobs import views as job_views
from console.web import audits, views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("login/", auth_views.LoginView.as_view(template_name="web/login.html", redirect_authenticated_user=True),
         name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("organizations/switch/", views.switch_organization, name="switch-organization"),
    path("invitations/", views.invitations, name="invitations"),
    path("clusters/", views.clusters, name="clusters"),
    path("clusters/<int:pk>/", views.cluster, name="cluster"),
    path("clusters/<int:pk>/status.json", views.cluster_status_json, name="cluster-status"),
    path("clusters/<int:pk>/incidents/<int:incident_pk>/", views.incident, name="incident"),
    path("clusters/<int:pk>/enrollment-tokens/<int:token_pk>/revoke/", views.revoke_enrollment_token,
         name="revoke-enrollment-token"),
    path("clusters/<int:pk>/audits/", audits.audits, name="audits"),
    path("audits/<int:audit_pk>/", audits.audit, name="audit"),
    path("audits/<int:audit_pk>/cancel/", audits.cancel_audit, name="audit-cancel"),
    path("audits/<int:audit_pk>/report.pdf", audits.audit_pdf, name="audit-pdf"),
    path("clusters/<int:pk>/jobs/", job_views.cluster_jobs, name="cluster-jobs"),
    path("jobs/<int:job_pk>/", job_views.job, name="job"),
]

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "console.tenancy"
    label = "tenancy"
    verbose_name = "Tenancy"

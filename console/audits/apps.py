from django.apps import AppConfig


class AuditsConfig(AppConfig):
    name = "console.audits"
    label = "audits"
    verbose_name = "Audits"

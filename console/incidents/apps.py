from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "console.incidents"
    label = "incidents"
    verbose_name = "Incidents"

    def ready(self) -> None:
        from console.incidents import telemetry  # noqa: F401  (the probe.window kind and its handler)

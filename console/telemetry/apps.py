from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "console.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry"

    def ready(self) -> None:
        from console.telemetry import builtin  # noqa: F401  (registers the kinds the console understands)

from django.apps import AppConfig


class ClocksConfig(AppConfig):
    name = "console.clocks"
    label = "clocks"
    verbose_name = "Clock sync"

    def ready(self) -> None:
        from console.clocks import metrics, plan, telemetry  # noqa: F401  (register the kind, the plan, the metric)

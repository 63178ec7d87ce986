from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "console.jobs"
    label = "jobs"
    verbose_name = "Training jobs"

    def ready(self) -> None:
        from console.jobs import telemetry  # noqa: F401  (stricter event kinds and their handlers)

from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "console.commands"
    label = "commands"
    verbose_name = "Agent commands"

    def ready(self) -> None:
        from console.commands import builtin  # noqa: F401  (registers the built-in command types)

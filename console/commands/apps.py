from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "console.commands"
    label = "commands"
    verbose_name = "Agent commands"

    def ready(self) -> None:
        from console.commands import activities, audit, builtin, probemesh  # noqa: F401  (register the built-in command types)

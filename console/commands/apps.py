from importlib import import_module

from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "console.commands"
    label = "commands"
    verbose_name = "Agent commands"

    def ready(self) -> None:
        from console.commands import builtin  # noqa: F401  (registers the built-in command types)

        import_module("console.commands.audit")  # the fleet audit's command types

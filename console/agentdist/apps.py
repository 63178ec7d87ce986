from django.apps import AppConfig


class AgentDistConfig(AppConfig):
    name = "console.agentdist"
    label = "agentdist"
    verbose_name = "Agent distribution"

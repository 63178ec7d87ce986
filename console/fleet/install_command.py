from django.conf import settings


def console_url(request) -> str:
    """The console's base URL as agents should reach it."""
    return settings.PUBLIC_URL or request.build_absolute_uri("/").rstrip("/")


def install_command(request, token: str) -> str:
    """The one line an operator pastes on a node to install and enroll the agent."""
    return f"curl -fsSL {console_url(request)}/install.sh | sudo sh -s -- --token {token}"

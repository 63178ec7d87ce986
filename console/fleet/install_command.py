from django.conf import settings

# Where the unattended line reads the token from: a root-only file the operator (or configuration
# management) puts on the node. The token is never in a command line: any user of a node can read
# those (/proc/*/cmdline), and sudo logs them.
TOKEN_FILE = "/root/lockstep.token"  # noqa: S105  (a path, not a secret)


def console_url(request) -> str:
    """The console's base URL as agents should reach it."""
    return settings.PUBLIC_URL or request.build_absolute_uri("/").rstrip("/")


def install_command(request) -> str:
    """The one line an operator pastes on a node; the installer asks for the token on the terminal."""
    return f"curl -fsSL {console_url(request)}/install.sh | sudo sh"


def install_command_token_file(request) -> str:
    """The same without a terminal: the token is read from TOKEN_FILE."""
    return f"curl -fsSL {console_url(request)}/install.sh | sudo sh -s -- --token-file {TOKEN_FILE}"

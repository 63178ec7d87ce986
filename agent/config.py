"""Agent configuration: a KEY=VALUE file, then the environment on top.

The file is systemd ``EnvironmentFile`` compatible (default
``/etc/lockstep/agent.env``): one ``KEY=VALUE`` per line, ``#`` or ``;``
comments, optional single or double quotes around the value, an optional
leading ``export``. Environment variables override the file. Every bad value is
a :class:`ConfigError` whose message names the key and the value.

Keys (all optional unless said otherwise):

==================================  ===========================================================
``LOCKSTEP_CONSOLE_URL``            console base URL (``https://console.example``); needed to
                                    enroll, otherwise the URL stored at enrollment is used
``LOCKSTEP_STATE_DIR``              credential, command results, telemetry buffer
                                    (default ``/var/lib/lockstep``)
``LOCKSTEP_CLUSTER_ID``             cluster the node must join (checked by the console)
``LOCKSTEP_ENROLL_TOKEN``           ``lse_...``: ``run`` enrolls with it when no credential is
                                    stored yet
``LOCKSTEP_HOSTNAME``               report this host name instead of the kernel's
``LOCKSTEP_MACHINE_ID``             report this machine id instead of ``/etc/machine-id``
``LOCKSTEP_SYSFS_ROOT``             where sysfs is mounted (default ``/sys``; tests point it at
                                    recorded trees)
``LOCKSTEP_TELEMETRY_BUFFER_BYTES`` disk bound of the telemetry buffer (default ``64M``;
                                    plain bytes or a ``K``/``M``/``G`` suffix, at least 4K)
``LOCKSTEP_LOG_LEVEL``              ``debug``, ``info`` (default), ``warning`` or ``error``
``LOCKSTEP_COMMAND_MODULES``        extra Python modules (comma-separated) imported at start so
                                    that they register command types
``LOCKSTEP_BACKOFF_MAX_S``          cap of the retry backoff while the console is unreachable
                                    (default 60)
``LOCKSTEP_SHUTDOWN_GRACE_S``       how long SIGTERM waits for running commands (default 5)
``LOCKSTEP_HEALTH_INTERVAL_S``      period of the ``node.health`` telemetry record (default 60)
``LOCKSTEP_INVENTORY_INTERVAL_S``   how often the inventory is re-read and re-sent when it
                                    changed (default 300)
``LOCKSTEP_AGENT_SOCKET``           the local socket for processes on the node (default
                                    ``/run/lockstep/agent.sock``; ``none``: no socket)
==================================  ===========================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_CONFIG_FILE = "/etc/lockstep/agent.env"
DEFAULT_STATE_DIR = "/var/lib/lockstep"
DEFAULT_SYSFS_ROOT = "/sys"
DEFAULT_AGENT_SOCKET = "/run/lockstep/agent.sock"
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024
MIN_BUFFER_BYTES = 4096

KNOWN_KEYS = (
    "LOCKSTEP_CONSOLE_URL",
    "LOCKSTEP_STATE_DIR",
    "LOCKSTEP_CLUSTER_ID",
    "LOCKSTEP_ENROLL_TOKEN",
    "LOCKSTEP_HOSTNAME",
    "LOCKSTEP_MACHINE_ID",
    "LOCKSTEP_SYSFS_ROOT",
    "LOCKSTEP_TELEMETRY_BUFFER_BYTES",
    "LOCKSTEP_LOG_LEVEL",
    "LOCKSTEP_COMMAND_MODULES",
    "LOCKSTEP_BACKOFF_MAX_S",
    "LOCKSTEP_SHUTDOWN_GRACE_S",
    "LOCKSTEP_HEALTH_INTERVAL_S",
    "LOCKSTEP_INVENTORY_INTERVAL_S",
    "LOCKSTEP_AGENT_SOCKET",
)

ENROLL_TOKEN_RE = re.compile(r"^lse_[A-Za-z0-9]{12}\.[A-Za-z0-9_\-]+$")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9\-_.]{0,251}[A-Za-z0-9])?$")
_MACHINE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-_.:]{0,127}$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ConfigError(Exception):
    """A configuration problem; the message names the key (or file) and says what to do."""


@dataclass(frozen=True)
class Config:
    console_url: str | None = None
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    cluster_id: int | None = None
    enroll_token: str | None = None
    hostname: str | None = None
    machine_id: str | None = None
    sysfs_root: Path = Path(DEFAULT_SYSFS_ROOT)
    telemetry_buffer_bytes: int = DEFAULT_BUFFER_BYTES
    log_level: str = "info"
    command_modules: tuple[str, ...] = ()
    backoff_max_s: float = 60.0
    shutdown_grace_s: float = 5.0
    health_interval_s: float = 60.0
    inventory_interval_s: float = 300.0
    agent_socket: Path | None = Path(DEFAULT_AGENT_SOCKET)
    unknown_keys: tuple[str, ...] = field(default=(), compare=False)


def parse_env_file(path: str | os.PathLike) -> dict[str, str]:
    """Read a systemd EnvironmentFile-style KEY=VALUE file."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist; create it or pass another --config") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc}") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY_RE.match(key):
            raise ConfigError(f"config file {str(path)!r} line {number}: expected KEY=VALUE, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key] = value
    return values


def validate_console_url(key: str, raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"{key}={raw!r} is not a console URL (expected http(s)://host[:port][/prefix])")
    return raw.rstrip("/")


def _positive_int(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None
    if value < 1:
        raise ConfigError(f"{key}={raw!r} must be a positive integer")
    return value


def _seconds(key: str, raw: str, minimum: float = 0.01, maximum: float = 86400.0) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number of seconds") from None
    if not (minimum <= value <= maximum):
        raise ConfigError(f"{key}={raw!r} must be between {minimum:g} and {maximum:g} seconds")
    return value


def parse_bytes(key: str, raw: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KkMmGg]?)(i?[Bb])?\s*", raw)
    if not match:
        raise ConfigError(f"{key}={raw!r} is not a size (use bytes, or a K, M or G suffix: 64M)")
    value = int(match.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[match.group(2).lower()]
    if value < MIN_BUFFER_BYTES:
        raise ConfigError(f"{key}={raw!r} is too small (at least {MIN_BUFFER_BYTES} bytes)")
    return value


def validate_enroll_token(key: str, raw: str) -> str:
    if not ENROLL_TOKEN_RE.match(raw):
        raise ConfigError(
            f"{key}={_redact(raw)!r} is not an enrollment token (expected lse_<12 characters>.<secret>; "
            "copy it again from the console's enrollment page)"
        )
    return raw


def validate_hostname(key: str, raw: str) -> str:
    if not _HOSTNAME_RE.match(raw):
        raise ConfigError(f"{key}={raw!r} is not a valid host name (letters, digits, '-', '_', '.')")
    return raw


def validate_machine_id(key: str, raw: str) -> str:
    if not _MACHINE_ID_RE.match(raw):
        raise ConfigError(f"{key}={raw!r} is not a valid machine id (letters, digits, '-', '_', '.', ':')")
    return raw


def _redact(token: str) -> str:
    head, _, _ = token.partition(".")
    return head + (".…" if "." in token else "")


def load(config_file: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """The configuration from ``config_file`` (default file if it exists) and ``environ``.

    An explicitly named file must exist; the default one is optional.
    """
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    if config_file is not None:
        values.update(parse_env_file(config_file))
    elif os.path.exists(DEFAULT_CONFIG_FILE):
        values.update(parse_env_file(DEFAULT_CONFIG_FILE))
    for key, value in env.items():
        if key.startswith("LOCKSTEP_"):
            values[key] = value
    return from_values(values)


def from_values(values: Mapping[str, str]) -> Config:
    """Validate raw KEY=VALUE strings into a :class:`Config` (empty values mean "unset")."""
    v = {k: s.strip() for k, s in values.items() if s is not None and s.strip() != ""}
    kwargs: dict[str, object] = {}
    if "LOCKSTEP_CONSOLE_URL" in v:
        kwargs["console_url"] = validate_console_url("LOCKSTEP_CONSOLE_URL", v["LOCKSTEP_CONSOLE_URL"])
    if "LOCKSTEP_STATE_DIR" in v:
        path = Path(v["LOCKSTEP_STATE_DIR"])
        if not path.is_absolute():
            raise ConfigError(f"LOCKSTEP_STATE_DIR={v['LOCKSTEP_STATE_DIR']!r} must be an absolute path")
        kwargs["state_dir"] = path
    if "LOCKSTEP_CLUSTER_ID" in v:
        kwargs["cluster_id"] = _positive_int("LOCKSTEP_CLUSTER_ID", v["LOCKSTEP_CLUSTER_ID"])
    if "LOCKSTEP_ENROLL_TOKEN" in v:
        kwargs["enroll_token"] = validate_enroll_token("LOCKSTEP_ENROLL_TOKEN", v["LOCKSTEP_ENROLL_TOKEN"])
    if "LOCKSTEP_HOSTNAME" in v:
        kwargs["hostname"] = validate_hostname("LOCKSTEP_HOSTNAME", v["LOCKSTEP_HOSTNAME"])
    if "LOCKSTEP_MACHINE_ID" in v:
        kwargs["machine_id"] = validate_machine_id("LOCKSTEP_MACHINE_ID", v["LOCKSTEP_MACHINE_ID"])
    if "LOCKSTEP_SYSFS_ROOT" in v:
        root = Path(v["LOCKSTEP_SYSFS_ROOT"])
        if not root.is_dir():
            raise ConfigError(f"LOCKSTEP_SYSFS_ROOT={v['LOCKSTEP_SYSFS_ROOT']!r} is not a directory")
        kwargs["sysfs_root"] = root
    if "LOCKSTEP_TELEMETRY_BUFFER_BYTES" in v:
        kwargs["telemetry_buffer_bytes"] = parse_bytes(
            "LOCKSTEP_TELEMETRY_BUFFER_BYTES", v["LOCKSTEP_TELEMETRY_BUFFER_BYTES"]
        )
    if "LOCKSTEP_LOG_LEVEL" in v:
        level = v["LOCKSTEP_LOG_LEVEL"].lower()
        if level not in ("debug", "info", "warning", "error"):
            raise ConfigError(
                f"LOCKSTEP_LOG_LEVEL={v['LOCKSTEP_LOG_LEVEL']!r} is not a level (debug, info, warning, error)"
            )
        kwargs["log_level"] = level
    if "LOCKSTEP_COMMAND_MODULES" in v:
        modules = tuple(m.strip() for m in v["LOCKSTEP_COMMAND_MODULES"].split(",") if m.strip())
        for module in modules:
            if not _MODULE_RE.match(module):
                raise ConfigError(
                    f"LOCKSTEP_COMMAND_MODULES={v['LOCKSTEP_COMMAND_MODULES']!r}: {module!r} is not a module name"
                )
        kwargs["command_modules"] = modules
    if "LOCKSTEP_BACKOFF_MAX_S" in v:
        kwargs["backoff_max_s"] = _seconds("LOCKSTEP_BACKOFF_MAX_S", v["LOCKSTEP_BACKOFF_MAX_S"], 0.05, 3600)
    if "LOCKSTEP_SHUTDOWN_GRACE_S" in v:
        kwargs["shutdown_grace_s"] = _seconds("LOCKSTEP_SHUTDOWN_GRACE_S", v["LOCKSTEP_SHUTDOWN_GRACE_S"], 0, 300)
    if "LOCKSTEP_HEALTH_INTERVAL_S" in v:
        kwargs["health_interval_s"] = _seconds("LOCKSTEP_HEALTH_INTERVAL_S", v["LOCKSTEP_HEALTH_INTERVAL_S"], 0.1)
    if "LOCKSTEP_INVENTORY_INTERVAL_S" in v:
        kwargs["inventory_interval_s"] = _seconds(
            "LOCKSTEP_INVENTORY_INTERVAL_S", v["LOCKSTEP_INVENTORY_INTERVAL_S"], 0.1
        )
    if "LOCKSTEP_AGENT_SOCKET" in v:
        raw = v["LOCKSTEP_AGENT_SOCKET"]
        if raw.lower() == "none":
            kwargs["agent_socket"] = None
        elif not Path(raw).is_absolute() or raw.endswith("/"):
            raise ConfigError(f"LOCKSTEP_AGENT_SOCKET={raw!r} must be an absolute path to a socket file, or 'none'")
        else:
            kwargs["agent_socket"] = Path(raw)
    kwargs["unknown_keys"] = tuple(sorted(k for k in v if k.startswith("LOCKSTEP_") and k not in KNOWN_KEYS))
    return Config(**kwargs)  # type: ignore[arg-type]

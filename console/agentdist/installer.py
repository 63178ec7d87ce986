"""Render ``agent/install/install.sh.in`` into the ``/install.sh`` the console serves.

The template gets the console's URL, the agent version and the package's file name and
sha256 (the installer checks what it downloads against this sha256, so the expected sum comes
from the script, not from the download), the same for every clock-sync variant (one line each:
``<target> <file> <sha256>``, the node picks its own), plus the supervisor script and the systemd unit from
``agent/install/`` and its own ``--help`` text (the header's Options and Exit codes).
"""

from __future__ import annotations

import re
from pathlib import Path

from console.agentdist.build import Package

INSTALL_DIR = Path(__file__).resolve().parents[2] / "agent" / "install"
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~\-/%]*)?$|"
                     r"^https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?(/[A-Za-z0-9._~\-/%]*)?$")
_MARKERS = ("LOCKSTEP_SUPERVISOR_END", "LOCKSTEP_UNIT_END", "LOCKSTEP_USAGE_END")


def valid_console_url(url: str) -> str:
    """The URL if it can be put in the script as is (it ends up inside single quotes)."""
    url = url.rstrip("/")
    if not _URL_RE.match(url):
        raise ValueError(f"{url!r} is not a URL the installer can use (set LOCKSTEP_PUBLIC_URL)")
    return url


def usage_text(template: str) -> str:
    lines = template.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Options:"))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("# Files"))
    text = "\n".join(re.sub(r"^# ?", "", line) for line in lines[start:end]).rstrip()
    return "Lockstep agent installer\n\n" + text


def render_install_script(console_url: str, package: Package, install_dir: Path = INSTALL_DIR,
                          variants: list[Package] = ()) -> str:
    template = (install_dir / "install.sh.in").read_text()
    supervisor = (install_dir / "supervise.sh").read_text().rstrip("\n")
    unit = (install_dir / "lockstep-agent.service").read_text().rstrip("\n")
    usage = usage_text(template)
    for piece in (supervisor, unit, usage):
        if any(marker in piece for marker in _MARKERS):
            raise ValueError("an embedded piece of the installer contains a here-document end marker")
    values = {
        "__LOCKSTEP_CONSOLE_URL__": valid_console_url(console_url),
        "__LOCKSTEP_AGENT_VERSION__": package.version,
        "__LOCKSTEP_PACKAGE_FILE__": package.filename,
        "__LOCKSTEP_PACKAGE_SHA256__": package.sha256,
        "__LOCKSTEP_NATIVE_PACKAGES__": "\n".join(f"{v.target} {v.filename} {v.sha256}" for v in variants
                                                    if v.target and re.fullmatch(r"[a-z0-9_-]+", v.target)),
        "__LOCKSTEP_SUPERVISOR__": supervisor,
        "__LOCKSTEP_UNIT__": unit,
        "__LOCKSTEP_USAGE__": usage,
    }
    for key, value in values.items():
        if key not in template:
            raise ValueError(f"install.sh.in has no {key}")
        template = template.replace(key, value)
    return template


def failing_script(message: str, code: int = 21) -> str:
    """A script that only says why the console cannot serve the installer (curl | sh shows it)."""
    quoted = message.replace("'", "'\\''")
    return f"#!/bin/sh\nprintf 'lockstep: error: %s\\n' '{quoted}' >&2\nexit {code}\n"

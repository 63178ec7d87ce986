"""Host facts: hostname, machine id, boot id, kernel, OS, CPU, memory (procfs and /etc)."""

from __future__ import annotations

import os
import platform
import socket

from agent.inventory.paths import HostPaths, read_text


def _os_release(paths: HostPaths) -> str:
    candidates = [paths.etc / "os-release"]
    if paths.live:
        candidates.append(paths.etc.parent / "usr" / "lib" / "os-release")
    for path in candidates:
        text = read_text(path)
        if text is None:
            continue
        fields = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                fields[key.strip()] = value.strip().strip("\"'")
        return fields.get("PRETTY_NAME") or " ".join(filter(None, [fields.get("NAME"), fields.get("VERSION")]))
    return ""


def _cpu(paths: HostPaths) -> tuple[str, int | None]:
    text = read_text(paths.proc / "cpuinfo") or ""
    model = ""
    count = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            count += 1
        elif key in ("model name", "Model Name", "cpu model") and not model:
            model = value.strip()
    if not model and paths.live:
        model = platform.processor()
    if count == 0 and paths.live:
        count = os.cpu_count() or 0
    return model, (count or None)


def _memory_bytes(paths: HostPaths) -> int | None:
    text = read_text(paths.proc / "meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def host_facts(
    paths: HostPaths, hostname: str | None = None, machine_id: str | None = None
) -> tuple[dict, list[str]]:
    """The ``host`` object of the inventory (and of the enrollment request), with errors."""
    errors: list[str] = []
    name = hostname or read_text(paths.proc / "sys" / "kernel" / "hostname") or ""
    if not name and paths.live:
        name = socket.gethostname()
    if not name:
        errors.append("host: hostname could not be read; set LOCKSTEP_HOSTNAME")
    mid = machine_id or read_text(paths.etc / "machine-id") or ""
    if not mid and paths.live:
        mid = read_text(paths.proc.parent / "var" / "lib" / "dbus" / "machine-id") or ""
    if not mid:
        errors.append("host: /etc/machine-id could not be read; set LOCKSTEP_MACHINE_ID")
    arch = read_text(paths.proc / "sys" / "kernel" / "arch") or (platform.machine() if paths.live else "")
    model, count = _cpu(paths)
    facts = {
        "hostname": name,
        "machine_id": mid,
        "boot_id": read_text(paths.proc / "sys" / "kernel" / "random" / "boot_id") or "",
        "kernel": read_text(paths.proc / "sys" / "kernel" / "osrelease") or (platform.release() if paths.live else ""),
        "os": _os_release(paths),
        "arch": arch,
        "cpu_model": model,
        "cpu_count": count,
        "memory_bytes": _memory_bytes(paths),
    }
    return facts, errors

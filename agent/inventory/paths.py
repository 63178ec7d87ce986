"""Where the inventory reads the host from: sysfs, procfs, /etc, and interface addresses.

Every sysfs/procfs/etc read goes through a :class:`HostPaths`, so tests point the
agent at a recorded tree. A recorded tree is a directory holding ``sys/``
(sysfs), and optionally ``proc/``, ``etc/`` and ``ip-addr.json`` (the output of
``ip -j addr`` on the recorded host). ``--sysfs-root DIR/sys`` selects it: the
siblings of that directory are used for procfs, /etc and addresses when they
exist; otherwise the live host's are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostPaths:
    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    etc: Path = Path("/etc")
    ip_addr_json: Path | None = None  # recorded `ip -j addr`; None: ask the kernel (netlink)

    @property
    def live(self) -> bool:
        return self.ip_addr_json is None and os.path.realpath(self.sys) == "/sys"

    @classmethod
    def from_sysfs_root(cls, sysfs_root: str | os.PathLike | None) -> HostPaths:
        if sysfs_root is None:
            return cls()
        root = Path(sysfs_root)
        if os.path.realpath(root) == "/sys":
            return cls()
        parent = root.parent
        proc = parent / "proc" if (parent / "proc").is_dir() else Path("/proc")
        etc = parent / "etc" if (parent / "etc").is_dir() else Path("/etc")
        recorded = parent / "ip-addr.json"
        return cls(sys=root, proc=proc, etc=etc, ip_addr_json=recorded if recorded.is_file() else Path(os.devnull))


def read_text(path: Path) -> str | None:
    """File content stripped, or None if it cannot be read (missing, EINVAL on a down link...)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None

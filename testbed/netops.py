"""Thin wrappers over `ip`, `tc` and `nft`: one subprocess per batch, loud errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence


class TestbedError(RuntimeError):
    """The testbed cannot do what was asked; the message says what and how to fix it."""

    __test__ = False  # not a pytest test class


def run(argv: Sequence[str], *, input: str | None = None, check: bool = True,
        timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise TestbedError(f"{argv[0]}: not installed (run scripts/setup-host.sh)") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise TestbedError(f"{' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''} failed: {detail}")
    return proc


def require_root_and_netns() -> None:
    """Raise a TestbedError naming the missing prerequisite (root, `ip`, network namespaces)."""
    if os.geteuid() != 0:
        raise TestbedError("the emulated testbed needs root (network namespaces, veths, nftables); "
                           "run as root, or use `python -m testbed simulate` for a simulated fabric")
    if shutil.which("ip") is None:
        raise TestbedError("`ip` (iproute2) is not installed; run scripts/setup-host.sh")
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise TestbedError(f"network namespaces are unavailable here: {proc.stderr.strip()}")


def netns_problem() -> str | None:
    """Why the emulated testbed cannot run here, or None when it can (for skips and the demo)."""
    try:
        require_root_and_netns()
    except TestbedError as exc:
        return str(exc)
    return None


def ip_batch(lines: Iterable[str], ns: str | None = None, force: bool = False, check: bool = True,
             timeout: float = 120) -> subprocess.CompletedProcess:
    text = "\n".join(lines) + "\n"
    argv = ["ip"] + (["-n", ns] if ns else []) + (["-force"] if force else []) + ["-batch", "-"]
    proc = run(argv, input=text, check=False, timeout=timeout)
    if check and proc.returncode != 0:
        raise TestbedError(f"ip -batch{' in ' + ns if ns else ''} failed: {proc.stderr.strip()}")
    return proc


def ns_configure(ns: str, sysctls: list[tuple[str, str]], aliases: list[tuple[str, str]],
                 batch: list[str]) -> None:
    """Inside `ns`: write sysctls and interface aliases, then run an `ip -batch`; one subprocess.

    A sysctl whose name starts with ``?`` is optional: written where the kernel has it per
    namespace, skipped where it does not.
    """
    script = ('for kv in "$@"; do case "$kv" in '
              '"?"*) kv=${kv#?}; printf %s "${kv#*=}" 2>/dev/null > "${kv%%=*}" || true;; '
              '/proc/*) printf %s "${kv#*=}" > "${kv%%=*}" || exit 1;; '
              '*) printf %s "${kv#*=}" > "/sys/class/net/${kv%%=*}/ifalias" || exit 1;; esac; done; '
              'exec ip -batch -')
    args = [f"?/proc/sys/{k[1:]}={v}" if k.startswith("?") else f"/proc/sys/{k}={v}" for k, v in sysctls]
    args += [f"{ifname}={alias}" for ifname, alias in aliases]
    argv = ["ip", "netns", "exec", ns, "sh", "-c", script, "sh", *args]
    proc = run(argv, input="\n".join(batch) + "\n", check=False, timeout=120)
    if proc.returncode != 0:
        raise TestbedError(f"configuring namespace {ns} failed: {proc.stderr.strip()}")


def set_root_aliases(aliases: list[tuple[str, str]]) -> None:
    for ifname, alias in aliases:
        with open(f"/sys/class/net/{ifname}/ifalias", "w") as f:
            f.write(alias)


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def links(ns: str | None = None, stats: bool = False) -> list[dict]:
    argv = ["ip"] + (["-n", ns] if ns else []) + (["-s"] if stats else []) + ["-j", "link", "show"]
    proc = run(argv, check=False)
    if proc.returncode != 0:
        return []
    return json.loads(proc.stdout or "[]")


def root_routes() -> list[dict]:
    return json.loads(run(["ip", "-j", "route", "show", "table", "all"]).stdout or "[]")


def root_addresses() -> list[dict]:
    return json.loads(run(["ip", "-j", "addr", "show"]).stdout or "[]")


def ns_pids(ns: str) -> list[int]:
    proc = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def nft(ns: str, script: str) -> None:
    if shutil.which("nft") is None:
        raise TestbedError("`nft` (nftables) is not installed; run scripts/setup-host.sh")
    run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script)


def nft_json(ns: str, *args: str) -> dict:
    proc = run(["ip", "netns", "exec", ns, "nft", "-j", *args], check=False)
    if proc.returncode != 0:
        return {"nftables": []}
    return json.loads(proc.stdout or '{"nftables": []}')


def tc(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(["tc", "-n", ns, *args], check=check)

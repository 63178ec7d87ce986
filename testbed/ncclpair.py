"""Two emulated hosts for the NCCL net plugin: namespaces `<prefix>a` and `<prefix>b`, each
with NICs nh0 and nh1, joined by veth pairs (nh0<->nh0 on 10.77.1.0/24, nh1<->nh1 on
10.77.2.0/24; host a is .1, host b is .2). With LOCKSTEP_NCCL_NICS="nh0,nh1" each host has
one plugin device: primary nh0, standby nh1.

Faults on one NIC of one host: `link(host, nic, up)` (carrier goes on both ends),
`lossy(host, nic, on)` (nftables drops everything in and out: 100% loss, carrier stays up).

    pair = NcclPair.create("nc1a2b")
    proc = pair.popen("a", [sys.executable, HARNESS, "send", ...], env=...)
    pair.link("a", "nh0", up=False)
    pair.destroy()
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .netops import TestbedError, run

HARNESS = str(Path(__file__).resolve().parent.parent / "nccl_plugin" / "harness" / "netplugin.py")
PLUGIN_DIR = Path(__file__).resolve().parent.parent / "nccl_plugin"
NICS = ("nh0", "nh1")
_TABLE = "lockstep_nccl_fault"


class NcclPair:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.ns = {"a": f"{prefix}a", "b": f"{prefix}b"}

    @classmethod
    def create(cls, prefix: str) -> NcclPair:
        pair = cls(prefix)
        try:
            for ns in pair.ns.values():
                _check(run(["ip", "netns", "add", ns], check=False), f"ip netns add {ns}")
            for k, nic in enumerate(NICS, start=1):
                _check(run(["ip", "link", "add", "name", nic, "netns", pair.ns["a"], "type", "veth", "peer", "name",
                            nic, "netns", pair.ns["b"]], check=False), f"veth {nic}")
                for host, last in (("a", 1), ("b", 2)):
                    ns = pair.ns[host]
                    _check(run(["ip", "-n", ns, "addr", "add", f"10.77.{k}.{last}/24", "dev", nic], check=False),
                           f"address of {host}/{nic}")
                    _check(run(["ip", "-n", ns, "link", "set", nic, "up"], check=False), f"{host}/{nic} up")
            for ns in pair.ns.values():
                run(["ip", "-n", ns, "link", "set", "lo", "up"], check=False)
        except BaseException:
            pair.destroy()
            raise
        return pair

    def address(self, host: str, nic: str) -> str:
        return f"10.77.{NICS.index(nic) + 1}.{1 if host == 'a' else 2}"

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns[host], *argv], **kwargs)  # noqa: S603

    def link(self, host: str, nic: str, up: bool) -> None:
        _check(run(["ip", "-n", self.ns[host], "link", "set", nic, "up" if up else "down"], check=False),
               f"link {host}/{nic}")

    def lossy(self, host: str, nic: str, on: bool) -> None:
        ns = self.ns[host]
        if on:
            rules = (f"table inet {_TABLE} {{\n"
                     f"  chain in {{ type filter hook input priority -300; iifname \"{nic}\" drop; }}\n"
                     f"  chain out {{ type filter hook output priority -300; oifname \"{nic}\" drop; }}\n}}\n")
            _check(run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, check=False), "nft drop")
        else:
            _check(run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", _TABLE], check=False),
                   "nft delete")

    def tx_bytes(self, host: str, nic: str) -> int:
        proc = run(["ip", "netns", "exec", self.ns[host], "cat", f"/sys/class/net/{nic}/statistics/tx_bytes"],
                   check=False)
        _check(proc, f"tx_bytes of {host}/{nic}")
        return int(proc.stdout)

    def destroy(self) -> None:
        for ns in self.ns.values():
            run(["ip", "netns", "del", ns], check=False)


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        raise TestbedError(f"{what} failed: {(proc.stderr or '').strip()}")

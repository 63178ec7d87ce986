"""One node's audit: collect the facts (``collect``), evaluate them (the pure check modules), report.

    report = run(["gpu", "pcie", "affinity", "nic", "host"], paths, nvml, args)

Each section is independent: a section whose facts cannot be read reports ``error`` results
and the others still run. The report is ``results.report`` (``lockstep.audit.node/v1``).
"""

from __future__ import annotations

from typing import Any

from agent.audit import affinity as affinity_checks
from agent.audit import collect
from agent.audit import gpu as gpu_checks
from agent.audit import host as host_checks
from agent.audit import nic as nic_checks
from agent.audit import pcie as pcie_checks
from agent.audit.results import Result, report
from agent.audit.thresholds import profile as threshold_profile
from agent.audit.xid import parse_kernel_log
from agent.inventory import affinity as inventory_affinity
from agent.inventory.paths import HostPaths
from agent.inventory.pcie import numa_node_of

SECTIONS = ("gpu", "pcie", "affinity", "nic", "host")


class _Facts:
    """Facts collected at most once per run, shared by the sections that need them."""

    def __init__(self, paths: HostPaths, nvml: Any, nvml_reason: str | None, listen_ms: int, clock: Any):
        self.paths, self.nvml, self.reason, self.listen_ms, self.clock = paths, nvml, nvml_reason, listen_ms, clock
        self._gpu: dict | None = None
        self._nic: dict | None = None

    @property
    def gpu(self) -> dict:
        if self._gpu is None:
            self._gpu = collect.collect_gpu_facts(self.nvml, self.reason, listen_ms=self.listen_ms)
        return self._gpu

    @property
    def nic(self) -> dict:
        if self._nic is None:
            self._nic = collect.collect_nic_facts(self.paths)
        return self._nic


def _hardware(facts: _Facts, override: str | None) -> tuple[str, dict]:
    if override:
        return override, threshold_profile(override)
    return gpu_checks.hardware_of(facts.gpu)


def run(sections: list[str] | tuple[str, ...], paths: HostPaths, nvml: Any, args: dict, *,
        nvml_reason: str | None = None, clock_service: Any = None) -> dict:
    """Run the named sections with the command's arguments; returns the node report."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown audit section {unknown[0]!r} (known: {', '.join(SECTIONS)})")
    facts = _Facts(paths, nvml, nvml_reason, int(args.get("listen_ms") or 0), clock_service)
    hardware, prof = _hardware(facts, args.get("hardware"))
    results: list[Result] = []
    out_facts: dict[str, Any] = {}
    errors: list[str] = []
    if "gpu" in sections:
        log, log_error = collect.read_kernel_log(paths)
        xids = parse_kernel_log(log or "")
        if log_error:
            errors.append(log_error)
        _, gpu_results = gpu_checks.evaluate(facts.gpu, xids, expected_gpus=args.get("expected_gpus"),
                                             hardware=hardware)
        results += gpu_results
        out_facts["gpu"] = {k: v for k, v in facts.gpu.items() if k != "errors"} | {"kernel_xids": xids}
    if "pcie" in sections:
        devices = [{"kind": "gpu", "name": f"GPU {g['index']}", "bdf": g["pci_bus_id"]}
                   for g in facts.gpu.get("gpus", []) if g.get("pci_bus_id")]
        devices += [{"kind": "nic", "name": n["device"], "bdf": n["pci_address"]}
                    for n in _audited_nics(facts.nic, args) if n.get("pci_address")]
        pcie_facts = collect.collect_pcie_facts(paths, devices)
        errors += pcie_facts["errors"]
        results += pcie_checks.evaluate(facts.gpu, pcie_facts, profile=prof)
        out_facts["pcie"] = {k: v for k, v in pcie_facts.items() if k != "errors"}
    if "affinity" in sections:
        gpus = [{"uuid": g.get("uuid", ""), "pci_bus_id": g.get("pci_bus_id", ""),
                 "numa_node": numa_node_of(paths, g["pci_bus_id"]) if g.get("pci_bus_id") else None}
                for g in facts.gpu.get("gpus", [])]
        pairs = inventory_affinity(paths, gpus, facts.nic.get("nics", []))
        results += affinity_checks.evaluate(facts.gpu.get("gpus", []), pairs, rails=args.get("rails"))
        out_facts["affinity"] = pairs
    if "nic" in sections:
        results += nic_checks.evaluate(facts.nic, expected=args.get("nics"), mtu=args.get("mtu"),
                                       speed_mbps=args.get("speed_mbps"), profile=prof)
        out_facts["nic"] = {"nics": _audited_nics(facts.nic, args)}
    if "host" in sections:
        host = collect.collect_host_facts(paths, facts.gpu, facts.nic, clock_service=clock_service)
        errors += host["errors"]
        results += host_checks.evaluate(host["host"], expect=args.get("expect"))
        out_facts["host"] = host["host"]
    if facts._gpu is not None:
        errors = list(facts._gpu.get("errors", [])) + errors
    if facts._nic is not None:
        errors += facts._nic.get("errors", [])
    name = sections[0] if len(sections) == 1 else "node"
    return report(name, results, hardware=hardware, facts=out_facts, errors=errors)


def _audited_nics(nic_facts: dict, args: dict) -> list[dict]:
    expected = args.get("nics")
    nics = nic_facts.get("nics", [])
    if expected:
        names = {e["device"] for e in expected}
        return [n for n in nics if n["device"] in names]
    return [n for n in nics if n.get("pci_address") or n.get("rdma_device")]

"""Host facts that must agree across a fleet: find the outliers. Pure.

Input: every node's ``host`` facts (the ``facts.host`` of its ``audit.host`` / ``audit.node``
report, ``agent.audit.collect.collect_host_facts``), by node name. For each key the value most
nodes share is the reference; a node with another value is an outlier, named with its value and
the reference. A key where no value has a strict majority is reported as split (every group
listed, no reference guessed). A node that did not report a key is ``unknown`` for it: never
counted as agreeing. Numeric keys with a tolerance (memory) agree within it of the median.

    report = agreement({"node0": facts0, "node1": facts1, ...})
    report["outliers"]  # [{"node": "node1", "key": "nccl", "value": ["2.19.3"], "reference": ["2.23.4"], ...}]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

FORMAT = "lockstep.audit.fleet/v1"
CODE = "LOCKSTEP_FR_FLEET_MISMATCH"


@dataclass(frozen=True)
class Key:
    name: str
    severity: str = "fail"  # what a disagreement is: fail (software image, firmware) or warn
    tolerance: float | None = None  # relative, numeric keys only
    why: str = ""


KEYS: tuple[Key, ...] = (
    Key("kernel", why="one kernel: drivers and RDMA stacks are built against it"),
    Key("os"),
    Key("gpu_driver", why="NCCL and CUDA behave per driver; mixed drivers break collectives"),
    Key("cuda_driver"),
    Key("cuda_toolkit"),
    Key("nccl", why="all ranks of a job must run one NCCL protocol version"),
    Key("nic_drivers"),
    Key("nic_firmware", why="mixed NIC firmware changes RDMA behaviour across the fabric"),
    Key("gpu_models"),
    Key("gpu_count"),
    Key("hugepages_total"),
    Key("hugepage_size_kb"),
    Key("transparent_hugepages", severity="warn"),
    Key("cpu_model", severity="warn"),
    Key("cpu_count", severity="warn"),
    Key("memory_bytes", severity="warn", tolerance=0.02, why="firmware reserves slightly different amounts"),
)


def _normal(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(sorted(str(v) for v in value))
    return value


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _key_report(key: Key, facts_by_node: dict[str, dict]) -> dict:
    known = {n: _normal(f[key.name]) for n, f in facts_by_node.items() if f.get(key.name) is not None}
    unknown = sorted(n for n in facts_by_node if n not in known)
    out: dict[str, Any] = {"key": key.name, "severity": key.severity, "unknown": unknown}
    if not known:
        return out | {"state": "unknown", "reference": None, "outliers": {}, "groups": []}
    if key.tolerance is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in known.values()):
        median = _median([float(v) for v in known.values()])
        outliers = {n: v for n, v in known.items() if abs(v - median) > key.tolerance * median}
        return out | {"state": "split" if len(outliers) * 2 >= len(known) else "agree" if not outliers else "outliers",
                      "reference": median, "tolerance": key.tolerance, "outliers": outliers, "groups": []}
    counts = Counter(known.values())
    groups = [{"value": _plain(v), "nodes": sorted(n for n, x in known.items() if x == v)}
              for v, _ in counts.most_common()]
    top, top_count = counts.most_common(1)[0]
    if len(counts) == 1:
        return out | {"state": "agree", "reference": _plain(top), "outliers": {}, "groups": groups}
    if top_count * 2 <= len(known):  # no strict majority: do not guess which side is right
        return out | {"state": "split", "reference": None, "outliers": {}, "groups": groups}
    outliers = {n: _plain(v) for n, v in known.items() if v != top}
    return out | {"state": "outliers", "reference": _plain(top), "outliers": outliers, "groups": groups}


def agreement(facts_by_node: dict[str, dict], keys: tuple[Key, ...] = KEYS) -> dict:
    """The fleet report: per key its state and reference, and every outlier (see the module doc)."""
    per_key = [_key_report(k, facts_by_node) for k in keys]
    outliers = []
    for key, rep in zip(keys, per_key, strict=True):
        for node, value in sorted(rep["outliers"].items()):
            outliers.append({
                "node": node, "key": key.name, "value": value, "reference": rep["reference"], "code": CODE,
                "status": key.severity,
                "message": f"{node}: {key.name} is {value!r} where {len(facts_by_node) - len(rep['outliers'])} "
                           f"of {len(facts_by_node)} nodes have {rep['reference']!r}" + (f" ({key.why})" if key.why else ""),
            })
        if rep["state"] == "split":
            sides = "; ".join(f"{g['value']!r} on {', '.join(g['nodes'])}" for g in rep["groups"])
            outliers.append({"node": None, "key": key.name, "value": None, "reference": None, "code": CODE,
                             "status": key.severity,
                             "message": f"no majority for {key.name}: {sides}" if sides else
                                        f"no majority for {key.name} within {key.tolerance:.0%} of the median"})
    statuses = {o["status"] for o in outliers}
    unknown = sorted({n for rep in per_key for n in rep["unknown"]})
    status = "fail" if "fail" in statuses else "warn" if statuses or unknown else "pass"
    return {"format": FORMAT, "nodes": sorted(facts_by_node), "status": status, "keys": per_key,
            "outliers": outliers, "unknown": unknown}

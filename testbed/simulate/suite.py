"""A set of simulated scenarios for benchmarks: every fault kind, healthy windows and a few
multi-fault windows, on one or more topologies, several seeds each."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.simulate.topology import TopoParams, generate_topology
from testbed.simulate.window import WindowConfig, normalize_faults, simulate
from workers.fabric.topology import parse_topology

DEFAULT_FAULT_SETS = (
    "none",
    "link_loss:1",
    "link_down:1",
    "link_congestion:1",
    "switch_loss:1",
    "nic_loss:1",
    "nic_down:1",
    "host_loss:1",
    "host_stall:1",
    "host_delay:1",
    "link_loss:2",
    "link_loss:1,host_loss:1",
    "switch_loss:1,nic_loss:1",
)


def _label(spec: str) -> str:
    return normalize_faults(spec).replace(":", "").replace(",", "+")


def build_suite(
    out_dir: str | Path,
    topologies: Sequence[tuple[str, dict[str, Any], TopoParams | None]],
    fault_sets: Sequence[str] = DEFAULT_FAULT_SETS,
    seeds: int = 2,
    first_seed: int = 1000,
    base: WindowConfig | None = None,
) -> list[dict[str, Any]]:
    """Write one directory per scenario (topology.json, observations.json, truth.json, as the
    public examples) and an index `suite.json`; return the index entries."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = base or WindowConfig()
    entries: list[dict[str, Any]] = []
    seed = first_seed
    for label, doc, params in topologies:
        topo = parse_topology(doc)
        for spec in fault_sets:
            for _ in range(seeds):
                config = replace(base, faults=spec, seed=seed)
                scenario = simulate(topo, config, params)
                name = f"{label}-{_label(spec)}-s{seed}"
                d = out / name
                scenario.write(d)
                entries.append({
                    "name": name,
                    "topology": doc["name"],
                    "faults": normalize_faults(spec),
                    "seed": seed,
                    "pairs": scenario.truth["scenario"]["pairs"],
                    "culprits": [[c["kind"], c["name"]] for c in scenario.truth["culprits"]],
                    "network_ok": scenario.truth["network_ok"],
                })
                seed += 1
    (out / "suite.json").write_text(json.dumps({"format": "lockstep.sim-suite/v1", "scenarios": entries},
                                               indent=1) + "\n")
    return entries


def preset_topology(label: str, params: TopoParams) -> tuple[str, dict[str, Any], TopoParams]:
    return label, generate_topology(params), params

"""The estimate graph ``lockstep.clockgraph/v1``: validation into arrays (``../shared/formats/clock.md``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

GRAPH_FORMAT = "lockstep.clockgraph/v1"
SOLUTION_FORMAT = "lockstep.clocksolution/v1"
MAX_NODES = 200_000
MAX_EDGES = 2_000_000


class GraphError(ValueError):
    """An invalid graph; ``key`` names the field (``edges[3].sigma_ns``), ``value`` what it held."""

    def __init__(self, key: str, problem: str, value: Any = None):
        self.key, self.problem, self.value = key, problem, value
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{key}: {problem} (got {shown})")


@dataclass(frozen=True)
class Graph:
    reference: str
    nodes: list[str]
    a: np.ndarray  # int64 node index of each edge's a
    b: np.ndarray
    offset_ns: np.ndarray  # b − a
    sigma_ns: np.ndarray
    drift_ppm: np.ndarray | None = None  # b − a, when every edge carries one
    drift_sigma_ppm: np.ndarray | None = None

    @property
    def ref_index(self) -> int:
        return self.nodes.index(self.reference)


def _number(value: Any, key: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GraphError(key, "must be a finite number", value)
    if positive and value <= 0:
        raise GraphError(key, "must be greater than 0", value)
    return float(value)


def parse_graph(doc: Any) -> Graph:
    """Validate a ``lockstep.clockgraph/v1`` document; raises :class:`GraphError` naming the field."""
    if not isinstance(doc, dict):
        raise GraphError("(document)", "must be a JSON object", type(doc).__name__)
    if doc.get("format") != GRAPH_FORMAT:
        raise GraphError("format", f"must be {GRAPH_FORMAT!r}", doc.get("format"))
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise GraphError("nodes", "must be a non-empty list of node names", nodes if not isinstance(nodes, list) else [])
    if len(nodes) > MAX_NODES:
        raise GraphError("nodes", f"at most {MAX_NODES} nodes", len(nodes))
    index: dict[str, int] = {}
    for i, name in enumerate(nodes):
        if not isinstance(name, str) or not name or len(name) > 200:
            raise GraphError(f"nodes[{i}]", "must be a non-empty string of at most 200 characters", name)
        if name in index:
            raise GraphError(f"nodes[{i}]", f"duplicate of nodes[{index[name]}]", name)
        index[name] = i
    reference = doc.get("reference")
    if not isinstance(reference, str) or reference not in index:
        raise GraphError("reference", "must name one of the nodes", reference)
    edges = doc.get("edges")
    if not isinstance(edges, list):
        raise GraphError("edges", "must be a list", type(edges).__name__)
    if len(edges) > MAX_EDGES:
        raise GraphError("edges", f"at most {MAX_EDGES} edges", len(edges))
    m = len(edges)
    a, b = np.empty(m, np.int64), np.empty(m, np.int64)
    off, sig = np.empty(m), np.empty(m)
    drift, drift_sig = np.empty(m), np.empty(m)
    with_drift = 0
    for k, e in enumerate(edges):
        key = f"edges[{k}]"
        if not isinstance(e, dict):
            raise GraphError(key, "must be an object", type(e).__name__)
        for end, out in (("a", a), ("b", b)):
            name = e.get(end)
            if not isinstance(name, str) or name not in index:
                raise GraphError(f"{key}.{end}", "must name one of the nodes", name)
            out[k] = index[name]
        if a[k] == b[k]:
            raise GraphError(f"{key}.b", "an edge must join two different nodes", e.get("b"))
        if "offset_ns" not in e:
            raise GraphError(f"{key}.offset_ns", "is required", None)
        off[k] = _number(e["offset_ns"], f"{key}.offset_ns")
        if "sigma_ns" not in e:
            raise GraphError(f"{key}.sigma_ns", "is required", None)
        sig[k] = _number(e["sigma_ns"], f"{key}.sigma_ns", positive=True)
        if "drift_ppm" in e:
            drift[k] = _number(e["drift_ppm"], f"{key}.drift_ppm")
            drift_sig[k] = _number(e.get("drift_sigma_ppm", 0.01), f"{key}.drift_sigma_ppm", positive=True)
            with_drift += 1
    has_drift = m > 0 and with_drift == m
    return Graph(reference, list(nodes), a, b, off, sig,
                 drift if has_drift else None, drift_sig if has_drift else None)

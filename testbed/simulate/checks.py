"""Format checks for `lockstep.observations/v1` and `lockstep.verdict/v1` (formats/fabric.md).

Pure. Each check collects every problem (up to a cap) with a path naming the offending entry and
raises `FormatError`; unknown keys are ignored (forward compatibility). Used on the public
examples and on everything the simulator writes.
"""

from __future__ import annotations

import math
from typing import Any

from workers.fabric.paths import PathIndex
from workers.fabric.topology import Topology

OBS_FORMAT = "lockstep.observations/v1"
VERDICT_FORMAT = "lockstep.verdict/v1"
MAX_ERRORS = 50
CULPRIT_KINDS = ("link", "switch", "nic", "host")


class FormatError(ValueError):
    def __init__(self, what: str, errors: list[str]):
        self.errors = errors
        more = "" if len(errors) < MAX_ERRORS else f" (first {MAX_ERRORS} shown)"
        super().__init__(f"invalid {what} document{more}: " + "; ".join(errors))


class _Errors(list):
    def add(self, msg: str) -> None:
        if len(self) < MAX_ERRORS:
            self.append(msg)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_observations(doc: Any, topology: Topology, index: PathIndex | None = None) -> None:
    """Validate an observations document against its topology; raise FormatError."""
    errors = _Errors()
    if not isinstance(doc, dict):
        raise FormatError(OBS_FORMAT, [f"document must be a JSON object, got {type(doc).__name__}"])
    if doc.get("format") != OBS_FORMAT:
        errors.add(f"format: expected {OBS_FORMAT!r}, got {doc.get('format')!r}")
    if "topology" in doc and doc["topology"] != topology.name:
        errors.add(f"topology: {doc['topology']!r} is not the topology given ({topology.name!r})")
    if "window_s" in doc and not (_number(doc["window_s"]) and doc["window_s"] > 0):
        errors.add(f"window_s: {doc['window_s']!r} is not a positive number")
    probes = doc.get("probes")
    if not isinstance(probes, list):
        errors.add("missing required key 'probes'" if probes is None else "probes: must be a list")
        raise FormatError(OBS_FORMAT, errors)
    index = index or PathIndex(topology)
    seen: dict[tuple[str, str], int] = {}
    for i, p in enumerate(probes):
        where = f"probes[{i}]"
        if not isinstance(p, dict):
            errors.add(f"{where}: must be an object")
            continue
        for key in ("src", "dst", "sent", "lost"):
            if key not in p:
                errors.add(f"{where}: missing required key {key!r}")
        src, dst = p.get("src"), p.get("dst")
        for key, v in (("src", src), ("dst", dst)):
            if key in p and not (isinstance(v, str) and topology.is_nic(v)):
                errors.add(f"{where}.{key}: {v!r} is not a NIC of topology {topology.name!r}")
        if isinstance(src, str) and src == dst:
            errors.add(f"{where}: src and dst are the same NIC {src!r}")
        sent, lost = p.get("sent"), p.get("lost")
        if "sent" in p and not _count(sent):
            errors.add(f"{where}.sent: {sent!r} is not a non-negative integer")
        if "lost" in p and not _count(lost):
            errors.add(f"{where}.lost: {lost!r} is not a non-negative integer")
        if _count(sent) and _count(lost) and lost > sent:
            errors.add(f"{where}.lost: {lost} is more than sent ({sent})")
        if "owd_us" in p:
            owd = p["owd_us"]
            if not isinstance(owd, dict):
                errors.add(f"{where}.owd_us: must be an object")
            else:
                for key, v in owd.items():
                    if not (_number(v) and v >= 0):
                        errors.add(f"{where}.owd_us.{key}: {v!r} is not a non-negative number")
                if _number(owd.get("p50")) and _number(owd.get("p99")) and owd["p50"] > owd["p99"]:
                    errors.add(f"{where}.owd_us: p50 {owd['p50']} is above p99 {owd['p99']}")
        if "path" in p:
            path = p["path"]
            if not isinstance(path, list) or not all(isinstance(x, str) for x in path):
                errors.add(f"{where}.path: must be a list of link ids")
            elif isinstance(src, str) and topology.is_nic(src):
                try:
                    nodes = index.walk(src, path)
                except ValueError as exc:
                    errors.add(f"{where}.{exc}")
                else:
                    if nodes[-1] != dst:
                        errors.add(f"{where}.path: ends at {nodes[-1]!r}, not at dst {dst!r}")
        if isinstance(src, str) and isinstance(dst, str):
            if (src, dst) in seen:
                errors.add(f"{where}: pair {src} -> {dst} already at probes[{seen[(src, dst)]}]")
            else:
                seen[(src, dst)] = i
    if errors:
        raise FormatError(OBS_FORMAT, errors)


def check_verdict(doc: Any, topology: Topology) -> None:
    """Validate a verdict (or ground-truth) document against its topology; raise FormatError."""
    errors = _Errors()
    if not isinstance(doc, dict):
        raise FormatError(VERDICT_FORMAT, [f"document must be a JSON object, got {type(doc).__name__}"])
    if doc.get("format") != VERDICT_FORMAT:
        errors.add(f"format: expected {VERDICT_FORMAT!r}, got {doc.get('format')!r}")
    ok = doc.get("network_ok")
    if not isinstance(ok, bool):
        errors.add("missing required key 'network_ok'" if "network_ok" not in doc else
                   f"network_ok: {ok!r} is not true or false")
    culprits = doc.get("culprits")
    if not isinstance(culprits, list):
        errors.add("missing required key 'culprits'" if culprits is None else "culprits: must be a list")
        raise FormatError(VERDICT_FORMAT, errors)
    links = {link.id for link in topology.links}
    hosts = {h.name for h in topology.hosts}
    seen: set[tuple[str, str]] = set()
    network_kinds = False
    for i, c in enumerate(culprits):
        where = f"culprits[{i}]"
        if not isinstance(c, dict):
            errors.add(f"{where}: must be an object")
            continue
        kind, name = c.get("kind"), c.get("name")
        for key in ("kind", "name"):
            if key not in c:
                errors.add(f"{where}: missing required key {key!r}")
        if "kind" in c and kind not in CULPRIT_KINDS:
            errors.add(f"{where}.kind: {kind!r} is not one of {', '.join(CULPRIT_KINDS)}")
        known = {"link": lambda n: n in links, "switch": topology.is_switch,
                 "nic": topology.is_nic, "host": lambda n: n in hosts}.get(kind)
        if known is not None and "name" in c and not (isinstance(name, str) and known(name)):
            errors.add(f"{where}.name: {name!r} is not a {kind} of topology {topology.name!r}")
        if "confidence" in c and not (_number(c["confidence"]) and 0 <= c["confidence"] <= 1):
            errors.add(f"{where}.confidence: {c['confidence']!r} is not a number in [0, 1]")
        if (kind, name) in seen:
            errors.add(f"{where}: {kind} {name!r} is named twice")
        seen.add((kind, name))
        network_kinds |= kind in ("link", "switch", "nic")
    if isinstance(ok, bool) and ok == network_kinds:
        errors.add(f"network_ok: {ok} contradicts the culprits (a link, switch or nic culprit means false)")
    if errors:
        raise FormatError(VERDICT_FORMAT, errors)

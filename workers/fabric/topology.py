"""`lockstep.topology/v1`: parse, validate and serialize fabric topologies.

Pure: data in, data out. Used by the console's import/export, the testbed, the simulator and
the fault triangulation. Validation collects every problem (up to a cap) with a path naming
the offending entry, so one round trip shows the operator everything to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FORMAT = "lockstep.topology/v1"
MAX_ERRORS = 50


@dataclass(frozen=True)
class Host:
    name: str


@dataclass(frozen=True)
class Switch:
    name: str
    tier: str


@dataclass(frozen=True)
class Nic:
    name: str
    host: str
    rail: int | None = None


@dataclass(frozen=True)
class Link:
    id: str
    a: str
    b: str


@dataclass(frozen=True)
class Topology:
    """A validated fabric: every reference resolves, every name is unique."""

    name: str
    hosts: tuple[Host, ...]
    switches: tuple[Switch, ...]
    nics: tuple[Nic, ...]
    links: tuple[Link, ...]
    _nic_index: dict[str, Nic] = field(default_factory=dict, compare=False, repr=False)
    _switch_index: dict[str, Switch] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._nic_index.update({n.name: n for n in self.nics})
        self._switch_index.update({s.name: s for s in self.switches})

    def nic(self, name: str) -> Nic:
        return self._nic_index[name]

    def is_nic(self, name: str) -> bool:
        return name in self._nic_index

    def is_switch(self, name: str) -> bool:
        return name in self._switch_index

    def nics_of(self, host: str) -> list[Nic]:
        return [n for n in self.nics if n.host == host]

    def to_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "hosts": [{"name": h.name} for h in self.hosts],
            "switches": [{"name": s.name, "tier": s.tier} for s in self.switches],
            "nics": [
                {"name": n.name, "host": n.host} | ({"rail": n.rail} if n.rail is not None else {})
                for n in self.nics
            ],
            "links": [{"id": link.id, "a": link.a, "b": link.b} for link in self.links],
        }


class TopologyError(ValueError):
    """The document is not a valid topology; `errors` lists every problem found."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        more = "" if len(errors) < MAX_ERRORS else f" (first {MAX_ERRORS} shown)"
        super().__init__(f"invalid {FORMAT} document{more}: " + "; ".join(errors))


class _Collector:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def add(self, message: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    @property
    def full(self) -> bool:
        return len(self.errors) >= MAX_ERRORS


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and value != "" and value.isprintable() and not any(
        ch.isspace() for ch in value
    )


def _string(entry: dict, key: str, where: str, errors: _Collector) -> str | None:
    if key not in entry:
        errors.add(f"{where}: missing required key {key!r}")
        return None
    value = entry[key]
    if not _is_name(value):
        errors.add(f"{where}.{key}: {value!r} is not a name (a non-empty string without spaces)")
        return None
    return value


def _entries(doc: dict, section: str, errors: _Collector, required: bool = True) -> list:
    if section not in doc:
        if required:
            errors.add(f"missing required key {section!r}")
        return []
    value = doc[section]
    if not isinstance(value, list):
        errors.add(f"{section}: must be a list, got {type(value).__name__}")
        return []
    return value


def parse_topology(doc: Any) -> Topology:
    """Validate a `lockstep.topology/v1` document and return it as a Topology.

    Unknown keys are ignored (forward compatibility). Raises TopologyError naming every missing
    key, bad value, duplicate name and unresolved reference found.
    """
    errors = _Collector()
    if not isinstance(doc, dict):
        raise TopologyError([f"document must be a JSON object, got {type(doc).__name__}"])
    if doc.get("format") != FORMAT:
        errors.add(f"format: expected {FORMAT!r}, got {doc.get('format')!r}")
    name = doc.get("name", "")
    if "name" in doc and not _is_name(name):
        errors.add(f"name: {name!r} is not a name (a non-empty string without spaces)")

    seen: dict[str, str] = {}  # every device name -> where it was first defined

    def define(device: str, where: str) -> None:
        if device in seen:
            errors.add(f"{where}.name: duplicate name {device!r} (first defined at {seen[device]})")
        else:
            seen[device] = where

    hosts: list[Host] = []
    for i, entry in enumerate(_entries(doc, "hosts", errors)):
        where = f"hosts[{i}]"
        if not isinstance(entry, dict):
            errors.add(f"{where}: must be an object")
            continue
        host_name = _string(entry, "name", where, errors)
        if host_name is not None:
            define(host_name, where)
            hosts.append(Host(host_name))
    host_names = {h.name for h in hosts}

    switches: list[Switch] = []
    for i, entry in enumerate(_entries(doc, "switches", errors)):
        where = f"switches[{i}]"
        if not isinstance(entry, dict):
            errors.add(f"{where}: must be an object")
            continue
        switch_name = _string(entry, "name", where, errors)
        tier = entry.get("tier", "")
        if not isinstance(tier, str):
            errors.add(f"{where}.tier: {tier!r} is not a string")
            tier = ""
        if switch_name is not None:
            define(switch_name, where)
            switches.append(Switch(switch_name, tier))

    nics: list[Nic] = []
    for i, entry in enumerate(_entries(doc, "nics", errors)):
        where = f"nics[{i}]"
        if not isinstance(entry, dict):
            errors.add(f"{where}: must be an object")
            continue
        nic_name = _string(entry, "name", where, errors)
        host = _string(entry, "host", where, errors)
        rail = entry.get("rail")
        if rail is not None and (not isinstance(rail, int) or isinstance(rail, bool) or rail < 0):
            errors.add(f"{where}.rail: {rail!r} is not a non-negative integer")
            rail = None
        if host is not None and host not in host_names:
            errors.add(f"{where}.host: {host!r} is not a defined host")
        if nic_name is not None:
            define(nic_name, where)
            if host is not None:
                nics.append(Nic(nic_name, host, rail))

    endpoints = {n.name for n in nics} | {s.name for s in switches}
    links: list[Link] = []
    link_ids: dict[str, str] = {}
    for i, entry in enumerate(_entries(doc, "links", errors)):
        where = f"links[{i}]"
        if not isinstance(entry, dict):
            errors.add(f"{where}: must be an object")
            continue
        link_id = _string(entry, "id", where, errors)
        ends = [_string(entry, end, where, errors) for end in ("a", "b")]
        if link_id is not None:
            if link_id in link_ids:
                errors.add(f"{where}.id: duplicate link id {link_id!r} (first at {link_ids[link_id]})")
            else:
                link_ids[link_id] = where
        for end, value in zip(("a", "b"), ends, strict=True):
            if value is not None and value not in endpoints:
                kind = "a host (links join NICs and switches)" if value in host_names else "not a NIC or switch"
                errors.add(f"{where}.{end}: {value!r} is {kind}")
        if ends[0] is not None and ends[0] == ends[1]:
            errors.add(f"{where}: both ends are {ends[0]!r}")
        if link_id is not None and ends[0] is not None and ends[1] is not None:
            links.append(Link(link_id, ends[0], ends[1]))

    if errors.errors:
        raise TopologyError(errors.errors)
    return Topology(
        name=name if isinstance(name, str) else "",
        hosts=tuple(hosts),
        switches=tuple(switches),
        nics=tuple(nics),
        links=tuple(links),
    )


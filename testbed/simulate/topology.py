"""Rail-optimized GPU fabrics as `lockstep.topology/v1` documents.

Shape (the NVIDIA DGX SuperPOD pattern, reference/clock_and_probes.md section 4):

- `hosts` servers with `rails` NICs each; NIC k of every host is on rail k.
- A scalable unit (SU) is `hosts_per_leaf` consecutive hosts; it has one leaf per rail, and NIC k of
  each of its hosts is cabled to the SU's rail-k leaf. (The last SU may be partial.)
- Two tiers (`su_per_pod` = 0): every leaf connects to every spine with `links_per_leaf_spine`
  parallel links; spines are `spine-p0-NN`.
- Three tiers (`su_per_pod` > 0): `su_per_pod` SUs form a pod with its own `spines` spines, every
  leaf of the pod connected to every spine of the pod. Spine j of every pod belongs to core plane
  j, which has `cores_per_plane` core switches; each spine connects to every core of its plane with
  `links_per_spine_core` parallel links. Cross-pod traffic goes leaf-spine-core-spine-leaf (6 hops).

Names and ids follow the public examples (scenarios/*/topology.json):
`node0000`, `node0000/nic0`, `leaf-su00-r0`, `spine-p0-00`, `core-pl00-00`;
links `node0000/nic0~leaf-su00-r0` (NIC first) and `leaf-su01-r6~spine-p0-00#0` (lower tier first,
`#k` numbering parallel links from 0). Documents list hosts, switches (leaves by SU then rail,
spines by pod, cores by plane), NICs (by host then rail), then links (access links by host then
rail, leaf-spine by leaf then spine then k, spine-core by spine then core then k).

The 9,216-GPU three-tier preset (`gpu9216`) has the reference counts: 1,152 hosts, 9,216 NICs,
288 leaves, 288 spines, 144 cores (36 SU of 32 nodes; pods of 2 SU with 16 spines, 2 links from
each leaf to each pod spine; 16 planes of 9 cores, 2 links from each spine to each core of its
plane). It has 9,216 + 9,216 + 5,184 = 23,616 links, not the 27,648 of a fully cabled 64-port
build: with complete bipartite planes and 36 SU, 144 cores cannot give every spine 32 uplinks
(9 does not divide 32), so this preset leaves spine uplinks undersubscribed (18 per spine).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from workers.fabric.topology import FORMAT


@dataclass(frozen=True)
class TopoParams:
    hosts: int
    rails: int = 8
    hosts_per_leaf: int = 32
    spines: int = 16
    links_per_leaf_spine: int = 2
    su_per_pod: int = 0
    cores_per_plane: int = 0
    links_per_spine_core: int = 1

    def __post_init__(self) -> None:
        problems = []
        for key in ("hosts", "rails", "hosts_per_leaf", "spines", "links_per_leaf_spine", "links_per_spine_core"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("su_per_pod", "cores_per_plane"):
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.su_per_pod > 0 and self.cores_per_plane < 1 and self.pods > 1:
            problems.append("a fabric with several pods needs cores_per_plane >= 1 (the core tier)")
        if problems:
            raise ValueError("invalid topology parameters: " + "; ".join(problems))

    @property
    def sus(self) -> int:
        return -(-self.hosts // self.hosts_per_leaf)

    @property
    def pods(self) -> int:
        return 1 if self.su_per_pod == 0 else -(-self.sus // self.su_per_pod)

    @property
    def three_tier(self) -> bool:
        return self.su_per_pod > 0 and self.cores_per_plane > 0

    @property
    def name(self) -> str:
        base = f"rail{self.rails}-h{self.hosts}-su{self.hosts_per_leaf}-s{self.spines}x{self.links_per_leaf_spine}"
        if self.su_per_pod > 0:
            base += f"-p{self.su_per_pod}-c{self.cores_per_plane}x{self.links_per_spine_core}"
        return base

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def counts(self) -> dict[str, int]:
        leaves = self.sus * self.rails
        spines = self.pods * self.spines
        cores = self.spines * self.cores_per_plane if self.three_tier else 0
        links = (
            self.hosts * self.rails
            + leaves * self.spines * self.links_per_leaf_spine
            + (spines * self.cores_per_plane * self.links_per_spine_core if self.three_tier else 0)
        )
        return {"hosts": self.hosts, "nics": self.hosts * self.rails, "leaves": leaves,
                "spines": spines, "cores": cores, "links": links}


_NAME = re.compile(
    r"^rail(?P<rails>\d+)-h(?P<hosts>\d+)-su(?P<hosts_per_leaf>\d+)-s(?P<spines>\d+)x(?P<links_per_leaf_spine>\d+)"
    r"(?:-p(?P<su_per_pod>\d+)-c(?P<cores_per_plane>\d+)x(?P<links_per_spine_core>\d+))?$"
)


def params_from_name(name: str) -> TopoParams | None:
    """The parameters encoded in a generated topology's name, or None for other names."""
    m = _NAME.match(name)
    if not m:
        return None
    values = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    try:
        return TopoParams(**values)
    except ValueError:
        return None


PRESETS: dict[str, tuple[TopoParams, str]] = {
    "example": (
        TopoParams(hosts=32, rails=8, hosts_per_leaf=8, spines=4, links_per_leaf_spine=1),
        "the public examples' fabric: 32 hosts x 8 rails, 4 SU of 8, 32 leaves, 4 spines (256 GPUs)",
    ),
    "gpu1024": (
        TopoParams(hosts=128, rails=8, hosts_per_leaf=32, spines=16, links_per_leaf_spine=2),
        "DGX B200 RA 4 SU: 128 hosts x 8 rails, 32 leaves, 16 spines, 2 links leaf-spine (1,024 GPUs)",
    ),
    "gpu2048-3tier": (
        TopoParams(hosts=256, rails=8, hosts_per_leaf=32, spines=16, links_per_leaf_spine=2,
                   su_per_pod=2, cores_per_plane=4, links_per_spine_core=2),
        "small three-tier: 8 SU in 4 pods, 64 leaves, 64 spines, 64 cores (2,048 GPUs)",
    ),
    "gpu9216": (
        TopoParams(hosts=1152, rails=8, hosts_per_leaf=32, spines=16, links_per_leaf_spine=2,
                   su_per_pod=2, cores_per_plane=9, links_per_spine_core=2),
        "three-tier NDR: 36 SU x 32 nodes, 288 leaves, 288 spines, 144 cores (9,216 GPUs)",
    ),
    "gpu9216-2tier": (
        TopoParams(hosts=1152, rails=8, hosts_per_leaf=72, spines=64, links_per_leaf_spine=1),
        "two-tier XDR (144-port): 16 SU x 72 nodes, 128 leaves, 64 spines (9,216 GPUs)",
    ),
}


def _width(n: int, minimum: int) -> int:
    return max(minimum, len(str(max(n - 1, 0))))


def generate_topology(params: TopoParams, name: str | None = None) -> dict[str, Any]:
    """The `lockstep.topology/v1` document of a rail-optimized fabric (see the module docstring)."""
    p = params
    hw = _width(p.hosts, 4)
    suw = _width(p.sus, 2)
    spw = _width(p.spines, 2)
    cw = _width(p.cores_per_plane, 2)
    plw = _width(p.spines, 2)
    hosts = [f"node{h:0{hw}d}" for h in range(p.hosts)]

    def leaf(su: int, rail: int) -> str:
        return f"leaf-su{su:0{suw}d}-r{rail}"

    def spine(pod: int, j: int) -> str:
        return f"spine-p{pod}-{j:0{spw}d}"

    def core(plane: int, i: int) -> str:
        return f"core-pl{plane:0{plw}d}-{i:0{cw}d}"

    switches = [{"name": leaf(su, r), "tier": "leaf"} for su in range(p.sus) for r in range(p.rails)]
    switches += [{"name": spine(pod, j), "tier": "spine"} for pod in range(p.pods) for j in range(p.spines)]
    if p.three_tier:
        switches += [{"name": core(j, i), "tier": "core"} for j in range(p.spines) for i in range(p.cores_per_plane)]
    nics = [{"name": f"{h}/nic{r}", "host": h, "rail": r} for h in hosts for r in range(p.rails)]
    links = []
    for hi, h in enumerate(hosts):
        su = hi // p.hosts_per_leaf
        for r in range(p.rails):
            a, b = f"{h}/nic{r}", leaf(su, r)
            links.append({"id": f"{a}~{b}", "a": a, "b": b})
    for su in range(p.sus):
        pod = 0 if p.su_per_pod == 0 else su // p.su_per_pod
        for r in range(p.rails):
            a = leaf(su, r)
            for j in range(p.spines):
                b = spine(pod, j)
                links += [{"id": f"{a}~{b}#{k}", "a": a, "b": b} for k in range(p.links_per_leaf_spine)]
    if p.three_tier:
        for pod in range(p.pods):
            for j in range(p.spines):
                a = spine(pod, j)
                for i in range(p.cores_per_plane):
                    b = core(j, i)
                    links += [{"id": f"{a}~{b}#{k}", "a": a, "b": b} for k in range(p.links_per_spine_core)]
    return {
        "format": FORMAT,
        "name": name or p.name,
        "hosts": [{"name": h} for h in hosts],
        "switches": switches,
        "nics": nics,
        "links": links,
    }


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def dump_topology(doc: dict[str, Any]) -> str:
    """Serialize as the public examples are: one entry per line, compact JSON."""
    head = f'{{"format":{_compact(doc["format"])},"name":{_compact(doc["name"])},\n'
    sections = []
    for key in ("hosts", "switches", "nics", "links"):
        body = ",\n".join(_compact(e) for e in doc[key])
        sections.append(f'"{key}":[\n{body}\n]')
    return head + ",\n".join(sections) + "}\n"

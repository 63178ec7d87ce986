"""ECMP paths of a cluster's declared fabric, through the pure path module.

A PathIndex is built per topology version and kept for reuse (a 9,216-GPU fabric takes a
fraction of a second to index, then answers a pair in microseconds).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from console.core.errors import Invalid
from console.fleet.models import Cluster
from console.fleet.topology_io import export_topology
from workers.fabric.paths import PathIndex, TooManyPaths
from workers.fabric.topology import parse_topology

_CACHE_SIZE = 8
_cache: OrderedDict[tuple[int, str], PathIndex] = OrderedDict()
_lock = threading.Lock()


def path_index(cluster: Cluster) -> PathIndex:
    key = (cluster.pk, cluster.topology_imported_at.isoformat() if cluster.topology_imported_at else "")
    with _lock:
        index = _cache.get(key)
        if index is not None:
            _cache.move_to_end(key)
            return index
    index = PathIndex(parse_topology(export_topology(cluster)))
    with _lock:
        _cache[key] = index
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return index


def ecmp_paths(cluster: Cluster, src: str, dst: str, limit: int) -> dict:
    """The shortest paths between two NICs; raises Invalid naming an unknown NIC."""
    index = path_index(cluster)
    for role, name in (("src", src), ("dst", dst)):
        if name not in index.nic_index:
            raise Invalid(f"{role}: {name!r} is not a NIC of this cluster's topology", field=role,
                          problem=f"{name!r} is not a NIC of this cluster's topology")
    if src == dst:
        raise Invalid("dst: the same NIC as src", field="dst", problem="the same NIC as src")
    count = index.count_paths(src, dst)
    try:
        paths = index.paths(src, dst, limit=limit)
        truncated = False
    except TooManyPaths:
        paths = []
        for path in index.iter_paths(src, dst):
            if len(paths) == limit:
                break
            paths.append(path)
        truncated = True
    return {"src": src, "dst": dst, "hops": index.hop_count(src, dst), "count": count,
            "paths": [list(p) for p in paths], "truncated": truncated}

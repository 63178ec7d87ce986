"""GPU<->NIC affinity against the expected rail layout. Pure.

On a rail-optimized server, GPU k sends its inter-node traffic through the NIC of rail k, and
that NIC must sit close to it on the PCIe tree (behind the same PCIe switch: ``PIX``, or a
switch hierarchy without the host bridge: ``PXB``), or GPUDirect RDMA crosses the CPU. The
relations are those of ``nvidia-smi topo -m``, computed by the inventory from sysfs
(``agent.inventory.affinity``).

``rails``: ``[{"rail": 0, "nic": "ibp24s0", "gpu": 0}]`` (``gpu`` defaults to the rail number,
i.e. GPU k on rail k). Without it, each GPU must have a close NIC of its own.
"""

from __future__ import annotations

from agent.audit.results import Result, bad, ok, skip
from agent.audit.thresholds import COMMON

ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")


def _nearest(relations: dict[str, str]) -> tuple[str | None, str]:
    """The closest NIC of a GPU (ties broken by name) and its relation."""
    if not relations:
        return None, "SYS"
    nic = min(relations, key=lambda n: (ORDER.index(relations[n]), n))
    return nic, relations[nic]


def evaluate(gpus: list[dict], affinity: list[dict], *, rails: list[dict] | None = None) -> list[Result]:
    """``gpus``: GPU facts (index, uuid, pci_bus_id); ``affinity``: pairs closer than SYS."""
    allowed = COMMON["affinity"]["allowed"]
    by_uuid: dict[str, dict[str, str]] = {}
    for pair in affinity:
        by_uuid.setdefault(pair["gpu"], {})[pair["nic"]] = pair["relation"]
    gpu_by_index = {g["index"]: g for g in gpus if g.get("reachable", True)}
    results: list[Result] = []
    if not gpu_by_index:
        return [skip("affinity.rail", {"kind": "host", "name": "GPUs"}, "No GPUs: no GPU-NIC affinity to check.")]
    if rails:
        for rail in rails:
            index = rail.get("gpu", rail["rail"])
            gpu = gpu_by_index.get(index)
            comp = {"kind": "gpu", "name": f"GPU {index}", "index": index, "rail": rail["rail"], "nic": rail["nic"]}
            if gpu is None:
                results.append(bad("affinity.rail", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                                   f"GPU {index} of rail {rail['rail']} is not present.", "See the GPU checks."))
                continue
            relations = by_uuid.get(gpu.get("uuid", ""), {})
            relation = relations.get(rail["nic"], "SYS")
            nearest, nearest_rel = _nearest(relations)
            ev = {"relation": relation, "nearest_nic": nearest, "nearest_relation": nearest_rel}
            if relation in allowed:
                results.append(ok("affinity.rail", comp, f"GPU {index} reaches {rail['nic']} over {relation}.", ev,
                                  {"allowed": list(allowed)}))
            else:
                hint = (f" Its closest NIC is {nearest} ({nearest_rel}): the rails are cabled or mapped "
                        "crosswise." if nearest and nearest_rel in allowed and nearest != rail["nic"] else "")
                results.append(bad("affinity.rail", comp, "fail", "LOCKSTEP_FR_GPU_NIC_AFFINITY", "config",
                                   f"GPU {index} reaches its rail-{rail['rail']} NIC {rail['nic']} over {relation}."
                                   + hint,
                                   "Fix the cabling or the rail-to-NIC mapping (NCCL_IB_HCA / the topology) so each "
                                   "GPU uses the NIC behind its own PCIe switch.", ev, {"allowed": list(allowed)}))
        return results
    owners: dict[str, list[int]] = {}
    for index, gpu in sorted(gpu_by_index.items()):
        comp = {"kind": "gpu", "name": f"GPU {index}", "index": index}
        nearest, relation = _nearest(by_uuid.get(gpu.get("uuid", ""), {}))
        ev = {"nearest_nic": nearest, "relation": relation}
        if nearest is None or relation not in allowed:
            results.append(bad("affinity.rail", comp, "fail", "LOCKSTEP_FR_GPU_NIC_AFFINITY", "config",
                               f"GPU {index} has no NIC closer than {relation}.",
                               "GPUDirect RDMA from this GPU crosses the CPU; check the server's PCIe layout.", ev,
                               {"allowed": list(allowed)}))
        else:
            owners.setdefault(nearest, []).append(index)
            results.append(ok("affinity.rail", comp, f"GPU {index} is next to {nearest} ({relation}).", ev,
                              {"allowed": list(allowed)}))
    for nic, idx in sorted(owners.items()):
        if len(idx) > 1:
            results.append(bad("affinity.shared", {"kind": "nic", "name": nic}, "warn",
                               "LOCKSTEP_FR_GPU_NIC_AFFINITY", "config",
                               f"GPUs {', '.join(map(str, idx))} share {nic} as their closest NIC.",
                               "Check that this is the server's design; otherwise a NIC is missing or misplaced.",
                               {"gpus": idx}))
    return results

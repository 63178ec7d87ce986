"""The audit's agent commands: node checks, the load generator and the collective bandwidth test.

| type              | what                                                              |
| ----------------- | ----------------------------------------------------------------- |
| ``audit.node``    | every node check (or ``sections``) in one report                  |
| ``audit.gpu``     | GPU health through NVML and the kernel log                        |
| ``audit.pcie``    | PCIe generation/width, replays, AER, ACS of GPUs and NICs         |
| ``audit.affinity``| GPU<->NIC placement against the rail layout                       |
| ``audit.nic``     | NIC link, speed, MTU, firmware, error counters                    |
| ``audit.host``    | clock sync and the facts the fleet must agree on                  |
| ``audit.load``    | timed UDP/TCP flows of the traffic plan, measured at both ends    |
| ``audit.collective``| a torch.distributed collective, bus bandwidth as nccl-tests     |

Results: ``lockstep.audit.node/v1`` reports (``agent.audit.results``), the load generator's
``lockstep.audit.load/v1`` and the collective's ``lockstep.audit.collective/v1``
(see notes/audit.md). The handlers are thin: arguments in, the pure evaluations out.
"""

from __future__ import annotations

from typing import Any

from agent.commands.registry import Arg, ArgError, CommandContext, command
from agent.inventory.gpus import load_nvml
from agent.inventory.paths import HostPaths

from . import collective, loadgen, node
from . import host as host_checks
from .thresholds import PROFILES

_HARDWARE = (*PROFILES, "generic")
_MISSING = object()


def _paths_and_nvml(ctx: CommandContext) -> tuple[HostPaths, Any, str | None]:
    paths = ctx.services.get("host_paths") or HostPaths()
    nvml = ctx.services.get("nvml", _MISSING)
    reason = None
    if nvml is _MISSING:
        nvml, reason = load_nvml()
    return paths, nvml, reason


def _dict_items(args: dict, name: str, fields: dict[str, tuple]) -> list[dict] | None:
    """Validate a list of objects argument: each item's fields (type, required[, minimum, maximum]);
    errors name the item."""
    value = args.get(name)
    if value is None:
        return None
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ArgError(f"argument {name}[{i}] must be an object, not {type(item).__name__}")
        unknown = sorted(set(item) - set(fields))
        if unknown:
            raise ArgError(f"argument {name}[{i}] has an unknown key {unknown[0]!r} (known: {', '.join(fields)})")
        for key, (typ, required, *bounds) in fields.items():
            if key not in item or item[key] is None:
                if required:
                    raise ArgError(f"argument {name}[{i}].{key} is required")
                continue
            ok = isinstance(item[key], typ) and not (typ is int and isinstance(item[key], bool))
            if not ok:
                raise ArgError(f"argument {name}[{i}].{key} must be {typ.__name__}, not {type(item[key]).__name__}")
            # (type, required[, minimum[, maximum]]); an int without bounds is at least 0
            low, high = ((bounds + [None])[:2] if bounds else [0, None]) if typ is int else (None, None)
            if low is not None and item[key] < low:
                raise ArgError(f"argument {name}[{i}].{key} must be at least {low}, not {item[key]}")
            if high is not None and item[key] > high:
                raise ArgError(f"argument {name}[{i}].{key} must be at most {high}, not {item[key]}")
            if typ is str and len(item[key]) > 200:
                raise ArgError(f"argument {name}[{i}].{key} is longer than 200")
        out.append(item)
    return out


NODE_ARGS = {
    "sections": Arg(list, items=str, default=list(node.SECTIONS), max_len=len(node.SECTIONS),
                    help="which checks: gpu, pcie, affinity, nic, host"),
    "hardware": Arg(str, choices=_HARDWARE, help="threshold profile (default: from the GPUs)"),
    "expected_gpus": Arg(int, min=0, max=64, help="GPUs the node must have (default: the profile's)"),
    "listen_ms": Arg(int, default=1000, min=0, max=30000, help="how long to listen for NVML Xid events"),
    "rails": Arg(list, items=dict, max_len=64, help='[{"rail": 0, "nic": "ibp24s0", "gpu": 0}]'),
    "nics": Arg(list, items=dict, max_len=256,
                help='fabric NICs: [{"device": "ibp24s0", "rail": 0, "mtu": 4092, "speed_mbps": 400000}]'),
    "mtu": Arg(int, min=68, max=65536, help="the fabric's MTU"),
    "speed_mbps": Arg(int, min=1, help="the fabric NICs' link speed"),
    "expect": Arg(dict, help='host facts to match: {"kernel": ..., "gpu_driver": ..., "nccl": [...]}'),
}


def checked_node_args(sections: list[str], args: dict) -> dict:
    """The node arguments with their nested lists checked; ArgError names the bad item."""
    unknown = [s for s in sections if s not in node.SECTIONS]
    if unknown:
        raise ArgError(f"argument sections: {unknown[0]!r} is not one of {', '.join(node.SECTIONS)}")
    rails = _dict_items(args, "rails", {"rail": (int, True, 0, 63), "nic": (str, True), "gpu": (int, False, 0, 63)})
    nics = _dict_items(args, "nics", {"device": (str, True), "rail": (int, False, 0, 63),
                                      "mtu": (int, False, 68, 65536), "speed_mbps": (int, False, 1),
                                      "firmware": (str, False)})
    unknown = sorted(set(args.get("expect") or {}) - set(host_checks.COMPARABLE))
    if unknown:
        raise ArgError(f"argument expect has an unknown key {unknown[0]!r} (known: {', '.join(host_checks.COMPARABLE)})")
    return dict(args) | {"rails": rails, "nics": nics}


def _run(sections: list[str], args: dict, ctx: CommandContext) -> dict:
    checked = checked_node_args(sections, args)
    paths, nvml, reason = _paths_and_nvml(ctx)
    return node.run(sections, paths, nvml, checked, nvml_reason=reason, clock_service=ctx.services.get("clock"))


def _subset(*keys: str) -> dict[str, Arg]:
    return {k: NODE_ARGS[k] for k in keys}


@command("audit.node", timeout_s=120, args=NODE_ARGS,
         description="Run the node checks (GPU, PCIe, affinity, NIC, host) and report each with its evidence.")
def audit_node(args: dict, ctx: CommandContext) -> dict:
    return _run(list(args["sections"]), args, ctx)


@command("audit.gpu", timeout_s=60, args=_subset("hardware", "expected_gpus", "listen_ms"),
         description="GPU health: ECC, row remaps, Xids, clocks, temperature, power, NVLink, fabric.")
def audit_gpu(args: dict, ctx: CommandContext) -> dict:
    return _run(["gpu"], args, ctx)


@command("audit.pcie", timeout_s=30, args=_subset("hardware", "nics"),
         description="PCIe links of GPUs, NICs and switch ports; replays, AER, ACS.")
def audit_pcie(args: dict, ctx: CommandContext) -> dict:
    return _run(["pcie"], args, ctx)


@command("audit.affinity", timeout_s=30, args=_subset("rails"),
         description="GPU-NIC PCIe affinity against the rail layout.")
def audit_affinity(args: dict, ctx: CommandContext) -> dict:
    return _run(["affinity"], args, ctx)


@command("audit.nic", timeout_s=30, args=_subset("hardware", "nics", "mtu", "speed_mbps"),
         description="NIC link state, speed, MTU, firmware and error counters.")
def audit_nic(args: dict, ctx: CommandContext) -> dict:
    return _run(["nic"], args, ctx)


@command("audit.host", timeout_s=30, args=_subset("expect"),
         description="Clock sync and the host facts the fleet must agree on.")
def audit_host(args: dict, ctx: CommandContext) -> dict:
    return _run(["host"], args, ctx)


LOAD_ARGS = {
    "run": Arg(int, required=True, min=0, max=2**32 - 1, help="the audit run id (stray packets of others are ignored)"),
    "start_at": Arg(float, required=True,
                    help="when every agent starts sending: cluster time (unix s) by the node's synchronized clock"),
    "duration_s": Arg(float, required=True, min=0.1, max=600),
    "window_s": Arg(float, default=1.0, min=0.1, max=60),
    "grace_s": Arg(float, default=1.0, min=0.0, max=30, help="how long receivers wait for late packets"),
    "packet_bytes": Arg(int, default=1400, min=24, max=65000),
    "protocol": Arg(str, default="udp", choices=("udp", "tcp")),
    "trace_ttl": Arg(int, default=0, min=0, max=64,
                     help="before the load, the hop each UDP flow reaches at this TTL (0: no trace)"),
    "trace_extra": Arg(int, default=0, min=0, max=16,
                       help="more traced tuples per flow, from kernel-chosen source ports"),
    "flows": Arg(list, items=dict, default=[], max_len=4096,
                 help='[{"id", "src", "src_addr", "device", "dst", "dst_addr", "sport", "dport", "rate_mbit"}]'),
    "listen": Arg(list, items=dict, default=[], max_len=256,
                  help='[{"nic", "addr", "device", "port", "flows": [{"id", "src"}]}]'),
}


@command("audit.load", timeout_s=900, args=LOAD_ARGS,
         description="Send and receive the traffic plan's flows at start_at; per-window throughput, loss and delay.")
def audit_load(args: dict, ctx: CommandContext) -> dict:
    try:
        return loadgen.run_load(args, cancelled=ctx.cancelled, clock=ctx.services.get("clock"))
    except loadgen.LoadError as exc:
        raise ArgError(str(exc)) from None


COLLECTIVE_ARGS = {
    "init": Arg(str, required=True, max_len=200, help="rendezvous, tcp://ADDR:PORT (rank 0's node)"),
    "world_size": Arg(int, required=True, min=1, max=65536),
    "rank_offset": Arg(int, default=0, min=0, help="global rank of this node's first local rank"),
    "local_ranks": Arg(int, default=1, min=1, max=64, help="ranks on this node (one per GPU with nccl)"),
    "backend": Arg(str, default="gloo", choices=("gloo", "nccl")),
    "op": Arg(str, default="all_reduce",
              choices=("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce")),
    "sizes": Arg(list, items=int, default=[1 << 20, 1 << 24], max_len=32, help="nccl-tests sizes in bytes"),
    "iters": Arg(int, default=20, min=1, max=10000),
    "warmup": Arg(int, default=5, min=0, max=1000),
    "dtype": Arg(str, default="float32", choices=("float32", "float16", "bfloat16", "float64")),
    "ifname": Arg(str, max_len=15, help="the NIC the ranks bind to (GLOO/NCCL_SOCKET_IFNAME)"),
    "env": Arg(dict, default={}, help="NCCL_*/GLOO_* settings, e.g. {\"NCCL_IB_HCA\": \"mlx5_0\"}"),
    "python": Arg(str, max_len=256, help="a python with torch (default: the agent's)"),
    "hardware": Arg(str, choices=_HARDWARE),
    "threshold": Arg(str, choices=("all_reduce_intra_node_busbw_gbs", "per_nic_busbw_gbs")),
    "min_busbw_gbs": Arg(float, min=0),
    "timeout_s": Arg(float, default=300, min=1, max=3600),
}


@command("audit.collective", timeout_s=3600, args=COLLECTIVE_ARGS,
         description="This node's ranks of a torch.distributed collective; bus bandwidth as nccl-tests.")
def audit_collective(args: dict, ctx: CommandContext) -> dict:
    try:
        return collective.run(args, cancelled=ctx.cancelled)
    except ValueError as exc:
        raise ArgError(str(exc)) from None

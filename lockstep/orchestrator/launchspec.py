"""Reading a torchrun command line into what ``lockstep run`` needs to start the same workers.

The command after ``--`` is parsed by torchrun's own argument parser
(``torch.distributed.run.get_args_parser``), so every flag torchrun accepts is accepted with
torchrun's meaning and defaults. Lockstep then launches and supervises the workers itself --
torchrun's agent would kill every worker when one fails -- so the flags that configure that
agent's restarts or its log plumbing are refused when they would change what the job does, with
the flag named. Accepted commands: ``torchrun ...``, ``python -m torch.distributed.run ...``.
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass, field

DEFAULT_MASTER_PORT = 29500


@dataclass
class LaunchSpec:
    nnodes: int
    nproc_per_node: int
    node_rank: int | None  # None: assigned at rendezvous (a c10d endpoint without --node-rank)
    master_addr: str
    master_port: int
    rdzv_id: str | None
    module: bool
    script: str
    script_args: list[str] = field(default_factory=list)
    max_restarts: int = 0
    role: str = "default"
    standalone: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def worker_argv(self) -> list[str]:
        """What follows ``python -m lockstep.runtime.launch``."""
        if self.module:
            return ["-m", self.script, *self.script_args]
        return [self.script, *self.script_args]


class LaunchError(ValueError):
    pass


def _strip_launcher(cmd: list[str]) -> list[str]:
    if not cmd:
        raise LaunchError("no command after '--': expected `torchrun [options] SCRIPT [ARGS]`")
    head = os.path.basename(cmd[0])
    if head == "torchrun":
        return cmd[1:]
    if head.startswith("python") and len(cmd) >= 3 and cmd[1] == "-m" and cmd[2] in ("torch.distributed.run",
                                                                                        "torch.distributed.launch"):
        return cmd[3:]
    raise LaunchError(f"expected a torchrun command after '--', got {shlex.join(cmd[:3])!r}")


def parse(cmd: list[str]) -> LaunchSpec:
    from torch.distributed.run import get_args_parser

    args_in = _strip_launcher(cmd)
    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        args = parser.parse_args(args_in)
    except SystemExit as exc:  # argparse already printed torchrun's usage and the error
        raise LaunchError("the torchrun arguments are invalid (torchrun's message above)") from exc
    except Exception as exc:
        raise LaunchError(f"torchrun arguments: {exc}") from exc
    notes = []
    lo, _, hi = str(args.nnodes).partition(":")
    try:
        nnodes_min, nnodes_max = int(lo), int(hi or lo)
    except ValueError:
        raise LaunchError(f"--nnodes {args.nnodes!r}: expected a number or MIN:MAX") from None
    if nnodes_min != nnodes_max:
        raise LaunchError(f"--nnodes {args.nnodes}: elastic node counts are not supported; Lockstep replaces "
                          "lost ranks with spares instead of resizing the job (give one number)")
    try:
        nproc = int(args.nproc_per_node)
    except ValueError:
        from torch.distributed.run import determine_local_world_size

        try:
            nproc = determine_local_world_size(args.nproc_per_node)
        except ValueError as exc:
            raise LaunchError(f"--nproc-per-node {args.nproc_per_node!r}: {exc}") from None
    if nproc < 1:
        raise LaunchError(f"--nproc-per-node {nproc}: must be at least 1")
    if args.no_python:
        raise LaunchError("--no-python: Lockstep runs the workers' Python itself to protect them "
                          "(it cannot inject its runtime into a non-Python command)")
    if args.run_path:
        notes.append("--run-path: the script runs as __main__ from its path (as Lockstep always does)")
    for flag, value, default in (("--log-dir", args.log_dir, None), ("--redirects", args.redirects, "0"),
                                 ("--tee", args.tee, "0"), ("--local-ranks-filter", args.local_ranks_filter, "")):
        if value not in (default, None, ""):
            raise LaunchError(f"{flag} {value}: worker output is not redirected by Lockstep; "
                              "workers write to this terminal as with plain torchrun")
    if args.max_restarts:
        notes.append(f"--max-restarts {args.max_restarts}: Lockstep replaces lost ranks instead of "
                     "restarting every worker; a rank failing in its own code still ends the job")
    node_rank = args.node_rank
    master_addr = args.master_addr
    master_port = args.master_port
    if args.standalone:
        if nnodes_min != 1:
            raise LaunchError("--standalone needs --nnodes 1")
        master_addr, master_port = "127.0.0.1", _free_port()
        node_rank = 0
    elif args.rdzv_endpoint:
        host, _, port = args.rdzv_endpoint.rpartition(":")
        if not host:
            host, port = args.rdzv_endpoint, str(DEFAULT_MASTER_PORT)
        master_addr = host
        try:
            master_port = int(port)
        except ValueError:
            raise LaunchError(f"--rdzv-endpoint {args.rdzv_endpoint!r}: the port is not a number") from None
        if args.rdzv_backend == "c10d" and "--node-rank" not in " ".join(args_in) and "--node_rank" not in " ".join(args_in):
            node_rank = None if nnodes_min > 1 else 0
    if master_port is None:
        master_port = DEFAULT_MASTER_PORT
    if node_rank is not None and not 0 <= node_rank < nnodes_min:
        raise LaunchError(f"--node-rank {node_rank}: must be between 0 and {nnodes_min - 1}")
    rdzv_id = None if args.rdzv_id in (None, "", "none") else args.rdzv_id
    return LaunchSpec(nnodes=nnodes_min, nproc_per_node=nproc, node_rank=node_rank, master_addr=master_addr,
                      master_port=int(master_port), rdzv_id=rdzv_id, module=bool(args.module),
                      script=args.training_script, script_args=list(args.training_script_args),
                      max_restarts=args.max_restarts, role=args.role, standalone=bool(args.standalone), notes=notes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(spec: LaunchSpec, *, rank: int, local_rank: int, node_rank: int, run_id: str,
               base: dict[str, str]) -> dict[str, str]:
    """The environment torchrun's agent gives a worker (torch/distributed/elastic/agent/server/
    local_elastic_agent.py), with the agent-hosted store (TORCHELASTIC_USE_AGENT_STORE)."""
    env = dict(base)
    env.update({
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": spec.role,
        "LOCAL_WORLD_SIZE": str(spec.nproc_per_node),
        "WORLD_SIZE": str(spec.world_size),
        "GROUP_WORLD_SIZE": str(spec.nnodes),
        "ROLE_WORLD_SIZE": str(spec.world_size),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    })
    if "OMP_NUM_THREADS" not in base and spec.nproc_per_node > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env

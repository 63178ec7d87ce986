"""``slurm``: a spare is a node of the job's own allocation that runs no rank.

The job is started inside an allocation with more nodes than torchrun's ``--nnodes`` (for
example ``salloc -N 5`` for ``--nnodes 4``; one ``lockstep run`` per rank node). The allocation's
nodes come from ``scontrol show job $SLURM_JOB_ID`` (its ``NodeList=``) expanded by ``scontrol show
hostnames``; the nodes in use are those whose supervisor is connected (their host names), plus the
ones already given a replacement. A replacement is started on a spare node with
``srun --jobid=J --nodes=1 --ntasks=1 --nodelist=HOST --overlap --export=ALL,...`` running a node
supervisor in join mode (``python -m lockstep.orchestrator.node --join ...``), which reports to the
orchestrator like any node. The job token reaches it through the inherited environment, never
the command line. ``LOCKSTEP_SLURM_EXCLUDE`` (comma-separated hosts) keeps nodes out.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys

from lockstep.schedulers import NoSpare


def parse_job_nodelist(scontrol_show_job: str) -> str:
    """The ``NodeList=`` of ``scontrol show job`` output (``(null)`` for a pending job)."""
    m = re.search(r"(?:^|\s)NodeList=(\S+)", scontrol_show_job)
    if not m or m.group(1) == "(null)":
        raise NoSpare("the Slurm job has no nodes yet (scontrol show job: NodeList is empty)")
    return m.group(1)


class SlurmScheduler:
    name = "slurm"

    def __init__(self, orchestrator, *, run=None):
        self.orch = orchestrator
        self.job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
        self._run = run or self._subprocess
        self.given: set[str] = set()
        self.exclude = {h for h in os.environ.get("LOCKSTEP_SLURM_EXCLUDE", "").split(",") if h}
        self.procs: list[subprocess.Popen] = []

    @staticmethod
    def _subprocess(argv: list[str]) -> str:
        if shutil.which(argv[0]) is None:
            raise NoSpare(f"{argv[0]} is not on PATH: the slurm scheduler needs the Slurm client commands")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise NoSpare(f"{' '.join(argv[:3])} failed: {proc.stderr.strip()[:300]}")
        return proc.stdout

    def allocation(self) -> list[str]:
        if not self.job_id:
            raise NoSpare("SLURM_JOB_ID is not set: run the job inside a Slurm allocation to use --scheduler slurm")
        nodelist = parse_job_nodelist(self._run(["scontrol", "show", "job", self.job_id]))
        return [h for h in self._run(["scontrol", "show", "hostnames", nodelist]).split() if h]

    def in_use(self) -> set[str]:
        hosts = {n.host.split(".")[0] for n in self.orch.nodes.values() if n.alive and n.host}
        return hosts | self.given | self.exclude

    def spares(self) -> list[str]:
        used = self.in_use()
        return [h for h in self.allocation() if h.split(".")[0] not in used]

    def spare_count(self) -> int:
        try:
            return len(self.spares())
        except NoSpare:
            return 0

    def describe(self) -> dict:
        return {"kind": self.name, "job_id": self.job_id, "given": sorted(self.given)}

    def command(self, host: str, *, node: int, rank: int, generation: int, incarnation: str) -> list[str]:
        exports = ",".join(["ALL", f"LOCKSTEP_JOB={self.orch.job}", f"LOCKSTEP_ORCHESTRATOR={self.orch_addr()}"])
        return ["srun", f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap",
                f"--export={exports}", sys.executable, "-m", "lockstep.orchestrator.node", "--join",
                str(node), str(rank), str(generation), incarnation]

    def orch_addr(self) -> str:
        launch = os.environ.get("LOCKSTEP_ORCHESTRATOR_ADDR")
        return launch or f"{self.orch.host_for_nodes()}:{self.orch.port}"

    async def start_replacement(self, *, rank: int, generation: int, incarnation: str, lost_node) -> dict:
        spares = await asyncio.to_thread(self.spares)
        if not spares:
            raise NoSpare(f"no spare node left in Slurm job {self.job_id} for rank {rank} "
                          f"(allocation fully used; allocate more nodes than --nnodes)")
        host = spares[0]
        node = max([n for n in self.orch.nodes] + [self.orch.nnodes - 1]) + 1
        argv = self.command(host, node=node, rank=rank, generation=generation, incarnation=incarnation)
        env = dict(os.environ, LOCKSTEP_JOB_TOKEN=self.orch.token)
        proc = await asyncio.to_thread(subprocess.Popen, argv, env=env, cwd=os.environ.get("LOCKSTEP_JOB_CWD"))
        self.procs.append(proc)
        self.given.add(host.split(".")[0])
        return {"node": node, "pid": proc.pid, "host": host}

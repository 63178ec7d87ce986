"""``local``: spares are warm processes kept by each node's ``lockstep run --spares N``.

A warm spare is a Python process that has already imported torch and the Lockstep runtime and
waits on a pipe (``lockstep.runtime.spare``); starting a replacement hands it the rank's
command line and environment, which saves the interpreter and import start-up (seconds). The
replacement goes to the lost rank's own node when it is alive and has a spare left (its local
rank is free again), else to the node with the most spares. Each node refills nothing: a job
started with ``--spares N`` survives N losses per node.
"""

from __future__ import annotations

from lockstep.orchestrator import core
from lockstep.schedulers import NoSpare


class LocalScheduler:
    name = "local"

    def __init__(self, orchestrator):
        self.orch = orchestrator

    def spare_count(self) -> int:
        return sum(n.spares for n in self.orch.nodes.values() if n.alive)

    def describe(self) -> dict:
        return {"kind": self.name, "spares": {n.node: n.spares for n in self.orch.nodes.values()}}

    async def start_replacement(self, *, rank: int, generation: int, incarnation: str, lost_node) -> dict:
        nodes = {n.node: {"alive": n.alive and n.conn is not None, "spares": n.spares}
                 for n in self.orch.nodes.values()}
        node = core.pick_node(nodes, lost_node)
        if node is None:
            used = self.orch.spares_used
            raise NoSpare(f"no spare left for rank {rank} ({used} used; start the job with a larger --spares)")
        reply = await self.orch.node_request(node, {"op": "spawn", "rank": rank, "generation": generation,
                                                    "incarnation": incarnation, "same_node": node == lost_node})
        if reply.get("op") != "spawned":
            raise NoSpare(f"node {node} could not start a replacement for rank {rank}: {reply.get('error')}")
        self.orch.nodes[node].spares = int(reply.get("spares", max(0, self.orch.nodes[node].spares - 1)))
        return {"node": node, "pid": reply.get("pid"), "host": self.orch.nodes[node].host}

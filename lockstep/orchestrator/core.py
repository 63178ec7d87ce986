"""The orchestrator's decisions, as pure functions of what the ranks and nodes reported.

No sockets, no clocks (callers pass ``now``), no torch: tested on their own
(``tests/lockstep/test_orchestrator_core.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# How far apart the survivors' completed collectives may be for a recovery: every rank keeps the
# inputs of this many completed ops (lockstep/runtime/group.py) to re-run them. The ops a backend
# runs at once (gloo: two) is the common case; a buffer broadcast's root, or a rank whose
# completion the failure cut off, makes it more.
RERUN_WINDOW = 4


class Unrecoverable(Exception):
    """The job cannot be carried on; the message says why, in a sentence for the user."""


# -- how a rank ended --------------------------------------------------------------------


def classify_exit(returncode: int | None, signal: int | None, expected: bool) -> str:
    """``finished`` (0), ``migrated`` (an exit the orchestrator asked for), ``lost`` (killed by a
    signal: the process died, its data-parallel state did not) or ``failed`` (the script raised
    or exited non-zero: a bug, that a replacement would hit again -- the job fails as under
    torchrun)."""
    if expected:
        return "migrated"
    if signal:
        return "lost"
    if returncode == 0:
        return "finished"
    return "failed"


# -- hard-failure recovery ----------------------------------------------------------------


@dataclass
class GroupProgress:
    done_seq: int
    done_key: tuple[int, int] | None
    inflight: list = field(default_factory=list)
    queued: list = field(default_factory=list)
    unprotected: list = field(default_factory=list)

    @classmethod
    def from_report(cls, d: dict) -> GroupProgress:
        key = d.get("done_key")
        return cls(int(d["done_seq"]), tuple(key) if key else None, d.get("inflight", []), d.get("queued", []),
                   d.get("unprotected", []))


@dataclass
class SurvivorReport:
    rank: int
    step_no: int
    groups: dict[str, GroupProgress]
    state_addr: str
    holding: bool = False


@dataclass
class RecoveryPlan:
    generation: int
    live_after: dict[str, list | None]  # group -> last key every survivor completed
    rerun_from_seq: dict[str, int]  # group -> first survivor sequence number to run again
    resume_at: dict[int, int]  # lost rank -> boundary its replacement resumes at
    donors: dict[int, list[str]]  # lost rank -> state servers to ask, best first
    redo_steps: int  # how many steps the survivors' work is re-done (0 or 1)


def plan_recovery(generation: int, survivors: list[SurvivorReport], lost: dict[int, int | None]) -> RecoveryPlan:
    """``lost`` maps each lost rank to the step of its last boundary replica (None: it never
    finished a step). The invariant behind the plan (see runtime/group.py): collectives run one
    at a time, so the survivors' completed sequence numbers differ by a few per group at most,
    and each survivor can re-run its last ``RERUN_WINDOW``.

    The rule on steps: a lost rank resumes at its replica's boundary ``a`` and nothing rolls
    back (a survivor keeps no older parameters), so ``a`` must be at least the slowest
    survivor's step ``S`` minus one -- the survivors redo at most the step that was in flight.
    A rank's own node's shared memory always satisfies it (the rank wrote ``post(S - 1)`` before
    it could hand over step ``S``'s gradients); a copy off a lost node does because the rank
    waits for it (``runtime/offnode``). Anything older is refused, saying so."""
    if not survivors:
        raise Unrecoverable("every rank was lost at once: no data-parallel replica holds the model state")
    group_ids = sorted(set().union(*(s.groups.keys() for s in survivors)))
    live_after: dict[str, list | None] = {}
    rerun: dict[str, int] = {}
    for gid in group_ids:
        progs = [(s.rank, s.groups[gid]) for s in survivors if gid in s.groups]
        if len(progs) != len(survivors):
            raise Unrecoverable(f"process group {gid!r} exists on some survivors only")
        for rank, p in progs:
            if p.unprotected:
                raise Unrecoverable(f"rank {rank} used {', '.join(p.unprotected)} on group {gid!r}: "
                                    "point-to-point traffic cannot be replayed")
        seqs = [p.done_seq for _, p in progs]
        lo, hi = min(seqs), max(seqs)
        if hi - lo > RERUN_WINDOW:
            raise Unrecoverable(f"survivors of group {gid!r} are {hi - lo} collectives apart "
                                f"(completed sequence numbers {sorted(set(seqs))}); at most {RERUN_WINDOW} "
                                "are recoverable")
        slowest = next(p for _, p in progs if p.done_seq == lo)
        live_after[gid] = list(slowest.done_key) if slowest.done_key else None
        rerun[gid] = lo + 1
    steps = [s.step_no for s in survivors]
    resume_at: dict[int, int] = {}
    donors: dict[int, list[str]] = {}
    redo = 0
    for rank, post_step in sorted(lost.items()):
        at = post_step or 0
        if at < min(steps) - 1:
            raise Unrecoverable(
                f"rank {rank}'s last replicated step is {at} but the survivors are at step {min(steps)}: "
                "its per-rank state (RNG, data position) for the steps in between is gone")
        resume_at[rank] = at
        exact = sorted((s for s in survivors if s.step_no == at), key=lambda s: s.rank)
        others = sorted((s for s in survivors if s.step_no != at), key=lambda s: (abs(s.step_no - at), s.rank))
        donors[rank] = [s.state_addr for s in exact + others]
        redo = max(redo, 1 if any(s.step_no > at or s.groups for s in survivors) else 0)
    return RecoveryPlan(generation, live_after, rerun, resume_at, donors, redo)


# -- proactive migration ------------------------------------------------------------------


def hold_boundary(steps: list[int], step_time_s: float, lead_s: float = 0.5, minimum: int = 2) -> int:
    """The boundary all ranks can still reach and hold at: ahead of the furthest rank by enough
    steps to cover the staleness of the heartbeats (``lead_s``)."""
    if not steps:
        raise ValueError("no live ranks")
    ahead = minimum
    if step_time_s > 0:
        ahead = max(minimum, int(lead_s / step_time_s) + 1)
    return max(steps) + ahead


# -- where a replacement goes -------------------------------------------------------------


def pick_node(nodes: dict[int, dict], lost_node: int | None) -> int | None:
    """A node with a free spare: the lost rank's own node when it is alive and has one (its
    data is local), else the alive node with the most spares. ``nodes``: node -> {"alive",
    "spares"}."""
    alive = {n: d for n, d in nodes.items() if d.get("alive") and d.get("spares", 0) > 0}
    if not alive:
        return None
    if lost_node in alive:
        return lost_node
    return max(sorted(alive), key=lambda n: alive[n]["spares"])


def ring(alive: list[int], leader: int | None) -> tuple[dict[int, int], list[int]]:
    """Who holds whose copies, and who takes over the orchestrator: the alive nodes in a ring in
    node order; each node's supervisor sends its ranks' small state to the next one (its
    *holder*), and the succession is the ring read from the node after the orchestrator's, so
    the first successor holds the orchestrator node's copies itself. A lone node holds nothing."""
    nodes = sorted(set(alive))
    holders = {n: nodes[(i + 1) % len(nodes)] for i, n in enumerate(nodes)} if len(nodes) > 1 else {}
    if leader in nodes:
        i = nodes.index(leader)
        succession = nodes[i + 1:] + nodes[:i]
    else:
        succession = nodes
    return holders, succession


def lost_nodes(last_seen: dict[int, float], now: float, timeout_s: float) -> list[int]:
    """Nodes whose supervisor has been silent for longer than ``timeout_s``."""
    return sorted(n for n, t in last_seen.items() if now - t > timeout_s)


# -- reporting ------------------------------------------------------------------------------


def heartbeat_parts(ranks: list[dict], per_part: int) -> list[list[dict]]:
    """A job's per-rank heartbeat rows cut into parts of at most ``per_part`` ranks, in rank
    order: one event carries one part, because the agent's local socket takes 64 KiB a line and
    a job of a few thousand ranks does not fit in one."""
    if per_part < 1:
        raise ValueError("per_part must be at least 1")
    ordered = sorted(ranks, key=lambda r: r["rank"])
    return [ordered[i:i + per_part] for i in range(0, len(ordered), per_part)] or [[]]

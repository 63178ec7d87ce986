"""Job snapshots through the injected runtime: capture every rank at one step boundary, restore a
fresh run from it (``lockstep snapshot`` / ``lockstep restore``; the orchestrator side is
``lockstep.orchestrator.snapshots``).

Preparation: before the hold the orchestrator sends ``snapshot_prepare``; each rank imports the
file writer (it imports ``torch.distributed.checkpoint``: seconds on a busy host) and starts its
capture engine's worker process while it trains on, and answers ``snapshot_prepared``. Without
it the first snapshot held every rank for the import. (Only the first one is slow: later ones
find both done.)

Capture: the orchestrator holds every rank at the same boundary (the migration's ``hold``), then
sends ``snapshot``. Each rank's control thread takes what the runtime discovered there
(``Runtime.capture_rank_state``: parameters, optimizer and scheduler states, RNG states, module
buffers, data-loader positions) plus the rank's iterator records (the RNG state at each
iterator's creation, the length of each finished one), stages it into the capture engine's arena
(``lockstep.checkpoint.files``: one ``rank<R>.pt``, ``torch.save`` format, read back with
``weights_only=True``) and says ``snapshot_staged``; the orchestrator releases the hold at once
and the engine's worker writes the file in the background (``snapshot_written``).

Restore: ``LOCKSTEP_RESTORE`` names a published snapshot directory. Every rank then starts as a
replacement does, with ``RestorePlan`` instead of a donor: it fast-forwards the unmodified
script to the snapshot's boundary (collectives phantom, data loaders stood in for), loads the
rank's file there, builds the groups' first generation (all ranks do, at the same boundary) and
goes live. Nothing is replayed: every collective after the boundary runs live.
"""

from __future__ import annotations

import atexit
import os
import threading

import torch

from lockstep.runtime import smallstate
from lockstep.runtime.replacement import Logs, Plan

WRITE_TIMEOUT_S = float(os.environ.get("LOCKSTEP_SNAPSHOT_WRITE_TIMEOUT_S", "300"))
_ENGINE = None
_ENGINE_LOCK = threading.Lock()


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.pt")


def _engine():
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            from lockstep.capture import Engine

            _ENGINE = Engine(name="lockstep-snapshot")
        return _ENGINE


_WRITING: list[threading.Thread] = []


def on_prepare(rt, msg: dict):
    """The orchestrator's ``snapshot_prepare`` (control thread): warm up beside training."""
    threading.Thread(target=_prepare, args=(rt, msg), name="lockstep-snapshot-prepare", daemon=True).start()


def _prepare(rt, msg: dict):
    import lockstep.checkpoint.files  # noqa: F401  (imports torch.distributed.checkpoint: not while held)

    _engine().start()  # the worker imports torch from now on; staging does not wait for it
    if rt.controller:
        rt.controller.send({"op": "snapshot_prepared", "id": msg.get("id")})


def on_order(rt, msg: dict):
    """The orchestrator's ``snapshot`` order (control thread): capture beside the held main thread."""
    thread = threading.Thread(target=_capture, args=(rt, msg), name="lockstep-snapshot", daemon=True)
    _WRITING[:] = [t for t in _WRITING if t.is_alive()] + [thread]
    thread.start()


@atexit.register
def _finish_writing():
    """A script that ends while its snapshot drains: the file is finished and reported first
    (the orchestrator publishes the snapshot only once every rank has said so)."""
    for thread in list(_WRITING):
        thread.join(WRITE_TIMEOUT_S)


def _capture(rt, msg: dict):
    from lockstep.checkpoint.files import save_files

    sid = msg["id"]
    send = rt.controller.send if rt.controller else (lambda m: None)
    try:
        if not rt.holding:
            raise RuntimeError(f"rank {rt.rank} is not holding at a boundary (step {rt.step_no})")
        state = rt.capture_rank_state()
        records = []
        if rt.node_dir:
            records = smallstate.read_records(smallstate.rank_paths(rt.node_dir, rt.rank)["records"])
        obj = {
            "step": state.step_no, "rank": rt.rank, "world_size": rt.world_size,
            "parameters": [p.detach() for p in state.parameters],
            "optimizers": state.optimizers, "schedulers": state.schedulers,
            "small": state.small, "records": [[meta, blob] for meta, blob in records],
            "logs": _group_logs(rt),
        }
        handle = save_files(_engine(), [(rank_file(msg["dir"], rt.rank), obj)])
    except Exception as exc:
        send({"op": "snapshot_failed", "id": sid, "error": str(exc)[:300]})
        return
    send({"op": "snapshot_staged", "id": sid, "step": state.step_no, "staged_s": round(handle.staged_s, 6),
          "bytes": handle.nbytes, "undiscovered": state.undiscovered})
    try:
        result = handle.wait(WRITE_TIMEOUT_S)
    except Exception as exc:
        send({"op": "snapshot_failed", "id": sid, "error": str(exc)[:300]})
        return
    send({"op": "snapshot_written", "id": sid, "bytes": int(result.get("bytes", 0)),
          "write_s": round(float(result.get("duration_s", 0.0)), 6)})


def _group_logs(rt) -> dict:
    """The collective results a replacement is served from a donor (interval 0, DDP's bucket
    rebuild): a restored rank's fast-forward needs the same values."""
    out = {}
    for gid, pg in list(rt.groups.items()):
        with pg._lock:
            out[gid] = {"permanent": [[list(k), v] for k, v in pg.permanent_log.items()],
                        "rebuild": list(pg.rebuild_log)}
    return out


class RestorePlan(Plan):
    """A replacement's plan whose state comes from the rank's snapshot file, not from a donor."""

    def __init__(self, rt, directory: str):
        super().__init__(rt, None, "")
        path = rank_file(directory, rt.rank)
        if not os.path.exists(path):
            raise RuntimeError(f"lockstep restore: {directory} has no state for rank {rt.rank}")
        # Empty byte strings (a record without a blob) pickle as a call of ``bytes``: harmless.
        with torch.serialization.safe_globals([bytes]):
            data = torch.load(path, map_location="cpu", weights_only=True)
        if int(data["world_size"]) != rt.world_size:
            raise RuntimeError(f"lockstep restore: the snapshot has {data['world_size']} ranks, "
                               f"this run {rt.world_size}")
        self.saved = data
        self.resume_at = int(data["step"])
        self.generation = 0
        self.live_after = {}  # no survivor has run anything past the boundary: all of it is live
        self._logs_fetched = True
        for gid, entry in data["logs"].items():
            self._logs.setdefault(gid, Logs()).merge(entry)
        self.source = {"post": (self.resume_at, dict(data["small"])), "mid": None, "pre": None}
        self.records = [(meta, bytes(blob)) for meta, blob in data["records"]]
        for meta, blob in self.records:
            key = (meta["loader"], meta["index"])
            if meta["ev"] == "iter":
                self._bundles[key] = blob
            elif meta["ev"] == "end":
                self._lengths[key] = meta["length"]

    def _fetch_state(self, boundary: int):
        data = self.saved
        return {"parameters": data["parameters"], "optimizers": data["optimizers"],
                "schedulers": data["schedulers"], "param_groups": None}, True

    def _fetch_logs(self, interval):
        return None

    def go_live(self, rt):
        self.saved = None  # the loaded state is the rank's own now
        super().go_live(rt)


def prepare_restore(rt, directory: str):
    """Make ``rt`` (before its hooks are installed) fast-forward to the snapshot and resume there."""
    rt.plan = RestorePlan(rt, directory)
    rt.replaying = True
    rt.phase = "ff"
    # The fast-forward's small state is not the rank's: nothing is written until it is live.
    rt._writers = None
    rt._records = None
    rt.side_effects.suppress()
    rt.say(f"restoring from {directory} at step {rt.plan.resume_at}")

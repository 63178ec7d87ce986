"""Job snapshots, the orchestrator's side: ``snapshot`` (on demand, from ``lockstep snapshot``)
and the periodic schedule (``lockstep run --snapshot-every``, ``LOCKSTEP_SNAPSHOT_EVERY_S``).

One snapshot: have every rank prepare (``snapshot_prepare``: the capture engine's worker started,
the writer imported -- only slow the first time, and training goes on meanwhile), hold every rank at one boundary (as a migration does: ``core.hold_boundary``,
again further ahead when a rank was already past it), order ``snapshot`` (each rank stages its
state into its capture engine, ``lockstep.runtime.snapshot``), release the hold as soon as every
rank has staged -- training is paused for the copy into host memory only -- and once every rank
has written its file, write ``manifest.json`` and publish the directory atomically
(``capture.fsutil``): a snapshot directory either is complete or does not exist under its name.

Where: ``$LOCKSTEP_SNAPSHOT_DIR/<job>/<id>`` (default ``<state dir>/snapshots/<job>/<id>``, which
is local and volatile: point it at shared storage to restore on other nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sys
import time

from lockstep.capture import fsutil
from lockstep.orchestrator import core, jobdir
from lockstep.orchestrator.server import command

MANIFEST = "manifest.json"
FORMAT = "lockstep-snapshot/1"


def snapshot_root(job: str) -> str:
    base = os.environ.get("LOCKSTEP_SNAPSHOT_DIR") or os.path.join(jobdir.state_dir(), "snapshots")
    return os.path.join(base, jobdir.check_name(job))


def find(job: str, snapshot_id: str) -> dict:
    """The manifest of a published snapshot (``path`` added); ValueError naming what is wrong."""
    if not jobdir.NAME_RE.match(snapshot_id or ""):
        raise ValueError(f"snapshot id {snapshot_id!r} is not a snapshot id")
    path = os.path.join(snapshot_root(job), snapshot_id)
    manifest = jobdir.read_json(os.path.join(path, MANIFEST))
    if manifest is None or manifest.get("format") != FORMAT:
        raise ValueError(f"no complete snapshot {snapshot_id!r} of job {job!r} (looked in {path})")
    return dict(manifest, path=path)


def list_snapshots(job: str) -> list[dict]:
    root = snapshot_root(job)
    try:
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        with contextlib.suppress(ValueError):
            out.append(find(job, name))
    return out


async def take(orch, reason: str) -> dict:
    if orch._task is not None and not orch._task.done():
        raise core.Unrecoverable(f"a {orch._task_kind} is under way")
    ranks = list(orch.ranks.values())
    not_running = [r.rank for r in ranks if r.status != "running" or r.conn is None]
    if not_running:
        raise core.Unrecoverable(f"ranks {not_running} are not running: no consistent snapshot now")
    orch._task_kind = "snapshot"
    orch._task = asyncio.current_task()
    try:
        return await _take(orch, ranks, reason)
    finally:
        orch._task_kind = None
        orch._task = None


async def _take(orch, ranks, reason: str) -> dict:
    t0 = time.monotonic()
    sid = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
    final = os.path.join(snapshot_root(orch.job), sid)
    partial = fsutil.partial_path(final, "0")
    os.makedirs(partial, mode=0o700)
    released = False

    def while_running(predicate):
        # A rank that ends its script before the hold never reaches the boundary: say so at once
        # (the CLI waits for this answer, and the orchestrator, ending, waits for the CLI).
        def check():
            ended = [f"rank {r.rank} {r.status}" for r in ranks if r.status in ("finished", "failed")]
            if ended:
                raise core.Unrecoverable(f"the job ended before the snapshot was taken ({', '.join(ended)}); nothing was written")
            return predicate()
        return check

    try:
        for r in ranks:
            r.events.pop("snapshot_prepared", None)
            r.conn.send({"op": "snapshot_prepare", "id": sid})
        await orch.wait_until(while_running(lambda: all(r.events.get("snapshot_prepared", {}).get("id") == sid for r in ranks)),
                              "every rank to prepare for the snapshot")
        prepare_s = time.monotonic() - t0
        step_time = max(r.step_time_s for r in ranks)
        boundary = core.hold_boundary([r.step for r in ranks], step_time)
        while True:
            for r in ranks:
                r.holding_at = None
                r.events.pop("hold_missed", None)
                r.conn.send({"op": "hold", "boundary": boundary})
            await orch.wait_until(while_running(lambda b=boundary: all(r.holding_at == b or "hold_missed" in r.events for r in ranks)),
                                  f"every rank to hold at step {boundary}")
            if not any("hold_missed" in r.events for r in ranks):
                break
            for r in ranks:
                r.conn.send({"op": "release"})
            boundary = core.hold_boundary([r.step for r in ranks], step_time, lead_s=1.5)
        held = time.monotonic()
        for r in ranks:
            for key in ("snapshot_staged", "snapshot_written", "snapshot_failed"):
                r.events.pop(key, None)
            r.conn.send({"op": "snapshot", "id": sid, "dir": partial})

        def reached(key):
            return all(r.events.get(key, {}).get("id") == sid or
                       r.events.get("snapshot_failed", {}).get("id") == sid for r in ranks)

        def check_failed():
            failed = [f"rank {r.rank}: {r.events['snapshot_failed'].get('error')}" for r in ranks
                      if r.events.get("snapshot_failed", {}).get("id") == sid]
            if failed:
                raise core.Unrecoverable("snapshot failed: " + "; ".join(failed))

        await orch.wait_until(while_running(lambda: reached("snapshot_staged")), "every rank to stage its state")
        for r in ranks:
            if r.conn:
                r.conn.send({"op": "release"})
        released = True
        paused_s = time.monotonic() - held
        check_failed()
        await orch.wait_until(lambda: reached("snapshot_written"), "every rank to write its state")
        check_failed()
        staged = [r.events["snapshot_staged"] for r in ranks]
        written = [r.events["snapshot_written"] for r in ranks]
        undiscovered = sorted({note for s in staged for note in s.get("undiscovered", [])})
        manifest = {
            "format": FORMAT, "id": sid, "job": orch.job, "step": boundary, "world_size": orch.world_size,
            "created": time.time(), "reason": reason,
            "bytes": sum(int(w.get("bytes", 0)) for w in written),
            "paused_s": round(paused_s, 6), "prepare_s": round(prepare_s, 6),
            "duration_s": round(time.monotonic() - t0, 6),
            "ranks": [{"rank": r.rank, "node": r.node, "file": f"rank{r.rank}.pt", "bytes": w.get("bytes", 0),
                       "staged_s": s.get("staged_s"), "write_s": w.get("write_s")}
                      for r, s, w in zip(ranks, staged, written, strict=True)],
            # What the runtime could not see is not in the snapshot: said, never silently dropped.
            "undiscovered": undiscovered,
        }
        jobdir.write_json(os.path.join(partial, MANIFEST), manifest)
        fsutil.publish_dir(partial, final, overwrite=False)
    except BaseException:
        if not released:
            for r in ranks:
                if r.conn:
                    r.conn.send({"op": "release"})
        shutil.rmtree(partial, ignore_errors=True)
        raise
    event = {k: manifest[k] for k in ("id", "step", "bytes", "paused_s", "duration_s", "reason", "undiscovered")}
    orch._event("job.snapshot", dict(event, path=final, ranks=orch.world_size))
    orch._journal()
    return dict(manifest, path=final)


@command("snapshot")
async def _snapshot_cmd(orch, msg: dict) -> dict:
    return {"ok": True, "result": await take(orch, "on demand")}


@command("snapshots")
async def _snapshots_cmd(orch, msg: dict) -> dict:
    return {"ok": True, "result": list_snapshots(orch.job)}


async def periodic(orch, every_s: float):
    """Take a snapshot every ``every_s`` seconds; a tick that finds a recovery or migration under
    way (or a rank not running) is skipped, not queued."""
    while True:
        await asyncio.sleep(every_s)
        if orch._done.is_set():
            return
        try:
            # A task of its own: a recovery cancels the snapshot under way, not the schedule.
            await asyncio.ensure_future(take(orch, "scheduled"))
        except asyncio.CancelledError:
            print(f"lockstep: job {orch.job}: scheduled snapshot interrupted by a recovery", file=sys.stderr, flush=True)
        except core.Unrecoverable as exc:
            print(f"lockstep: job {orch.job}: scheduled snapshot skipped: {exc}", file=sys.stderr, flush=True)


def start_schedule(orch):
    """Called once the orchestrator serves: the periodic snapshots, if asked for."""
    every = float(os.environ.get("LOCKSTEP_SNAPSHOT_EVERY_S") or 0)
    if every > 0:
        orch._snapshot_task = asyncio.get_running_loop().create_task(periodic(orch, every))

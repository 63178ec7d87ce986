"""A replacement's plan: what it knows about the rank it replaces and the group it rejoins.

The orchestrator sends it in pieces (``update``): at once the lost rank's small state and records
(read from its node's shared memory) and the boundary to resume at; the group's progress
(``live_after``: per group, the key of the last collective every survivor completed) once the
survivors have reported; in a proactive migration, how far it may fast-forward while the rank it
replaces is still training (``ff_limit``) until the job holds at a boundary. A shadow
(``shadow``) is the same follow mode without an end: ``ff_limit`` moves on as the rank trains,
until the rank is lost and the recovery sends the shadow the boundary to resume at, as it would
a fresh replacement.

At the resume boundary the replacement loads, in this order: parameters and optimizer states
from a donor (a survivor at that boundary, so they are the values the lost rank had), the
donor's scheduler and optimizer-hyper-parameter snapshot of that boundary, the live data-loader
iterators at the lost rank's positions, the lost rank's buffers and RNG states; then it builds
the group's next generation and replays: collectives the survivors completed are served from
their logs (or skipped, for gradient buckets), the rest run live. If it skipped any gradient
bucket its own optimizer step was not the real one, so at the next boundary it loads the
survivors' state again (``resync``), and from there on it is an ordinary rank.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time

from lockstep.runtime import priority, smallstate, transfer

PLAN_TIMEOUT_S = float(os.environ.get("LOCKSTEP_PLAN_TIMEOUT_S", "120"))


class Logs:
    def __init__(self):
        self._permanent: dict[tuple, list] = {}
        self._rebuild: list = []
        self._interval: dict[tuple, list] = {}

    def merge(self, entry: dict):
        for key, tensors in entry.get("permanent", []):
            self._permanent[tuple(key)] = tensors
        if entry.get("rebuild"):
            self._rebuild = entry["rebuild"]
        for key, tensors in entry.get("interval", []):
            self._interval[tuple(key)] = tensors

    def permanent(self, key):
        return self._permanent.get(tuple(key))

    def rebuild(self, n):
        return self._rebuild[n] if n < len(self._rebuild) else None

    def interval(self, key):
        key = tuple(key)
        return self._interval.get(key, self._permanent.get(key))


def _b64(s):
    return base64.b64decode(s) if s else b""


class Plan:
    def __init__(self, rt, controller, token: str):
        self.rt = rt
        self.controller = controller
        self.token = token
        self._cv = threading.Condition()
        self.resume_at: int | None = None
        self.generation: int | None = None
        self.donors: list[str] = []
        self.live_after: dict | None = None
        self.rerun_from_seq: dict[str, int] = {}
        self.ff_limit: int | None = None
        # A shadow follows a live rank (``ff_limit`` moves on) until that rank is lost or the job
        # ends; its supervisor starts it at idle priority (``priority``).
        self.shadow = False
        self._restored = False
        self.source: dict = {}
        self.records: list[tuple[dict, bytes]] = []
        self._lengths: dict[tuple[int, int], int] = {}
        self._bundles: dict[tuple[int, int], bytes] = {}
        self._logs: dict[str, Logs] = {}
        self._logs_fetched = False
        self.failed: str | None = None
        self.started = time.monotonic()

    # -- updates from the orchestrator (control thread) -----------------------------------

    def update(self, msg: dict):
        with self._cv:
            if "resume_at" in msg and msg["resume_at"] is not None:
                self.resume_at = int(msg["resume_at"])
            if "generation" in msg:
                self.generation = int(msg["generation"])
            if msg.get("donors"):
                self.donors = list(msg["donors"])
            if "live_after" in msg and msg["live_after"] is not None:
                self.live_after = {g: (tuple(k) if k is not None else None) for g, k in msg["live_after"].items()}
            if msg.get("rerun_from_seq"):
                self.rerun_from_seq = {g: int(n) for g, n in msg["rerun_from_seq"].items()}
            if "ff_limit" in msg:
                self.ff_limit = msg["ff_limit"]
            if "shadow" in msg:
                self.shadow = bool(msg["shadow"])
            if self.resume_at is not None and not self.shadow and not self._restored:
                # Adopted (or never a shadow): a rank from here on, at normal priority at once
                # (the supervisor lowered the shadow's threads when it started it); its
                # fast-forward is timed from here.
                priority.restore_all()
                if msg.get("shadow") is False:
                    self.started = time.monotonic()
                self._restored = True
            if msg.get("source"):
                self._set_source(msg["source"])
            if msg.get("fail"):
                self.failed = msg["fail"]
            self._cv.notify_all()

    def _set_source(self, src: dict):
        out = {}
        for kind in smallstate.KINDS:
            slot = src.get(kind)
            out[kind] = (int(slot[0]), smallstate.decode(_b64(slot[1]))) if slot else None
        self.source = out
        self.records = [(meta, _b64(blob)) for meta, blob in src.get("records", [])]
        for meta, blob in self.records:
            key = (meta["loader"], meta["index"])
            if meta["ev"] == "iter":
                self._bundles[key] = blob
            elif meta["ev"] == "end":
                self._lengths[key] = meta["length"]

    def wait_for(self, predicate, what: str, timeout: float = PLAN_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        with self._cv:
            while not predicate():
                if self.failed:
                    raise RuntimeError(f"lockstep: recovery abandoned: {self.failed}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"lockstep: no {what} from the orchestrator after {timeout:.0f} s")
                self._cv.wait(min(left, 1.0))

    # -- what the runtime asks ------------------------------------------------------------

    def iterator_length(self, loader_id: int, index: int) -> int | None:
        return self._lengths.get((loader_id, index))

    def logs(self, group_id: str) -> Logs:
        if not self._logs_fetched:
            self._fetch_logs(None)
        return self._logs.setdefault(group_id, Logs())

    def _fetch_logs(self, interval):
        self._logs_fetched = True
        for addr in self.donors:
            try:
                header, payload = transfer.request(addr, self.token, {"op": "logs", "interval": interval})
            except OSError:
                continue
            if header.get("ok") and payload is not None:
                for gid, entry in payload.items():
                    self._logs.setdefault(gid, Logs()).merge(entry)
                return header
        return None

    def pin(self, kind: str, step: int, rt):
        slot = self.source.get(kind)
        if slot is not None and slot[0] == step and step == self.resume_at:
            fields = dict(slot[1])
            fields.pop("data", None)
            rt.load_small(fields)

    # -- boundaries ------------------------------------------------------------------------

    def on_boundary(self, rt):
        if rt.phase == "ff":
            self._follow(rt)
            if self.resume_at is not None and rt.step_no == self.resume_at:
                self.resume(rt)
            elif self.resume_at is not None and rt.step_no > self.resume_at:
                rt.diverged(f"fast-forward passed the resume boundary {self.resume_at}")
        elif rt.phase == "replay":
            if rt.tainted:
                self.resync(rt)
            else:
                self.go_live(rt)

    def _follow(self, rt):
        """Proactive migration and shadows: never fast-forward past what the rank being replaced
        has done."""
        if self.resume_at is not None:
            return

        def free():
            return self.resume_at is not None or (self.ff_limit is not None and rt.step_no < self.ff_limit)

        if self.controller and rt.step_no % 64 == 0:
            self.controller.send({"op": "ff_progress", "step": rt.step_no})
        deadline = time.monotonic() + 10 * PLAN_TIMEOUT_S
        while not free():
            # Caught up with the rank it replaces: say so (again each second) until the job holds.
            if self.controller:
                self.controller.send({"op": "ff_progress", "step": rt.step_no})
            self._wait_briefly(free, 1.0)
            if self.shadow:  # waits as long as the rank it shadows lives
                deadline = time.monotonic() + 10 * PLAN_TIMEOUT_S
            if time.monotonic() > deadline:
                raise RuntimeError("lockstep: the migration never reached its boundary")

    def _wait_briefly(self, predicate, seconds: float):
        with self._cv:
            if not predicate() and not self.failed:
                self._cv.wait(seconds)
        if self.failed:
            raise RuntimeError(f"lockstep: recovery abandoned: {self.failed}")

    def _fetch_state(self, boundary: int):
        """Parameters etc. at ``boundary`` from the first donor sitting there; if every donor is
        already past it, the state of the first one's current boundary (``exact`` False)."""
        errors = []
        for addr in self.donors:
            try:
                header, payload = transfer.request(addr, self.token, {"op": "state", "boundary": boundary, "timeout": 30})
            except OSError as exc:
                errors.append(f"{addr}: {exc}")
                continue
            if header.get("ok"):
                return payload, True
            errors.append(f"{addr}: {header.get('error')}")
        for addr in self.donors:
            try:
                header, payload = transfer.request(addr, self.token, {"op": "state", "boundary": -1, "timeout": 30})
            except OSError:
                continue
            if header.get("ok"):
                return payload, False
        raise RuntimeError("lockstep: no donor could serve the state: " + "; ".join(errors))

    def resume(self, rt):
        t0 = time.monotonic()
        self.wait_for(lambda: self.live_after is not None and self.generation is not None, "recovery plan")
        payload, exact = self._fetch_state(self.resume_at)
        rt.load_parameters(payload["parameters"])
        rt.load_optimizer_states(payload["optimizers"], payload["param_groups"] if exact else None)
        if exact and payload["schedulers"] is not None:
            rt.load_schedulers(payload["schedulers"])
        post = self.source.get("post")
        if post is not None and post[0] == self.resume_at:
            fields = post[1]
            want = {(lid, idx): pos for lid, idx, pos in json.loads(fields.get("data", b"[]"))}
            have = {(p.loader_id, p.index): p for p in list(rt.proxies) if not p.exhausted}
            if set(want) != set(have):
                rt.diverged(f"live data-loader iterators {sorted(have)} differ from the original's {sorted(want)}")
            for key, proxy in have.items():
                if proxy.pos != want[key]:
                    rt.diverged(f"data-loader {key[0]} iterator {key[1]} is at batch {proxy.pos}, "
                                f"the original was at {want[key]}")
                proxy.go_live(self._bundles.get(key), want[key])
            rt.load_small(fields)
        elif self.resume_at:
            rt.diverged(f"no small state of the lost rank at boundary {self.resume_at}")
        if exact:
            self._fetch_logs(self.resume_at)
        else:
            rt.note_inexact(f"no survivor was still at step {self.resume_at}; the replayed step is re-synced")
        for gid, pg in rt.groups.items():
            pg.join_live(self.generation, self.live_after.get(gid), self.rerun_from_seq.get(gid))
        rt.side_effects.restore()
        rt.live_after = dict(self.live_after)
        rt.tainted = not exact
        rt.phase = "replay"
        rt.say(f"resumed at step {self.resume_at} (fast-forward {t0 - self.started:.2f} s, "
               f"state load {time.monotonic() - t0:.2f} s{'' if exact else ', inexact step re-synced next'})")
        if self.controller:
            self.controller.send({"op": "resumed", "step": rt.step_no, "exact": exact})

    def resync(self, rt):
        payload, exact = self._fetch_state(rt.step_no)
        if not exact:
            rt.diverged(f"no survivor at step {rt.step_no} to re-sync the replayed step from")
        rt.load_parameters(payload["parameters"])
        rt.load_optimizer_states(payload["optimizers"], payload["param_groups"])
        if payload["schedulers"] is not None:
            rt.load_schedulers(payload["schedulers"])
        rt.tainted = False
        if self.controller:
            self.controller.send({"op": "resynced", "step": rt.step_no})

    def go_live(self, rt):
        rt.replaying = False
        rt.phase = "live"
        rt.start_writing(self.records)
        rt.say(f"live at step {rt.step_no}")
        if self.controller:
            self.controller.send({"op": "live", "step": rt.step_no})

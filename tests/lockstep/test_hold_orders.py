"""A rank's side of ``hold`` / ``release``: the orders the orchestrator sends to park every rank at
one step boundary (migration, snapshot), answered against the step the training thread is at.

The training thread is a real thread driving the runtime's optimizer-step hooks; the orders come
from the test thread as the controller's thread would deliver them."""

import queue
import threading

import pytest
import torch

from lockstep.runtime import control
from lockstep.runtime.context import Runtime


class Sent:
    def __init__(self):
        self.messages = queue.Queue()

    def send(self, msg):
        self.messages.put(msg)

    def next(self, timeout=10.0):
        return self.messages.get(timeout=timeout)


class Trainer:
    """A training thread that takes ``steps`` optimizer steps through the runtime's hooks."""

    def __init__(self, rt, steps):
        self.rt = rt
        param = torch.nn.Parameter(torch.zeros(1))
        self.opt = torch.optim.SGD([param], lr=0.1)
        self.go = threading.Semaphore(0)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(steps,), daemon=True)
        self.thread.start()

    def _run(self, steps):
        try:
            for _ in range(steps):
                self.go.acquire()
                self.rt.on_pre_step(self.opt)
                self.rt.on_post_step(self.opt)
        except SystemExit:  # the runtime's exit, faked by the test that orders one
            return
        self.done.set()

    def steps(self, n):
        for _ in range(n):
            self.go.release()

    def wait_step(self, n, timeout=10.0):
        with self.rt._boundary_cv:
            assert self.rt._boundary_cv.wait_for(lambda: self.rt.step_no >= n, timeout)


@pytest.fixture
def rank():
    rt = Runtime({"RANK": "0", "WORLD_SIZE": "2"})
    sent = Sent()
    rt.controller = sent
    ctl = control.Controller.__new__(control.Controller)  # its order handling only, no sockets
    ctl.rt, ctl.send = rt, sent.send
    return rt, ctl, sent


def park(rt, ctl, sent, trainer, boundary):
    ctl._dispatch({"op": "hold", "boundary": boundary})
    trainer.steps(boundary - rt.step_no + 3)
    assert sent.next() == {"op": "holding", "boundary": boundary}
    assert rt.step_no == boundary and rt.holding


def test_a_rank_ordered_to_hold_ahead_parks_exactly_at_that_boundary(rank):
    rt, ctl, sent = rank
    trainer = Trainer(rt, 7)
    park(rt, ctl, sent, trainer, 4)
    ctl._dispatch({"op": "release"})
    trainer.wait_step(7)
    assert trainer.done.wait(10)


def test_a_release_followed_at_once_by_a_later_hold_moves_a_parked_rank_on_to_the_new_boundary(rank):
    rt, ctl, sent = rank
    trainer = Trainer(rt, 12)
    park(rt, ctl, sent, trainer, 3)
    ctl._dispatch({"op": "release"})
    ctl._dispatch({"op": "hold", "boundary": 6})
    assert sent.next() == {"op": "holding", "boundary": 6}
    assert rt.step_no == 6


def test_a_parked_rank_ordered_again_to_its_own_boundary_says_it_is_holding_there(rank):
    rt, ctl, sent = rank
    trainer = Trainer(rt, 8)
    park(rt, ctl, sent, trainer, 2)
    ctl._dispatch({"op": "hold", "boundary": 2})
    assert sent.next() == {"op": "holding", "boundary": 2}
    assert rt.holding and rt.step_no == 2


def test_a_parked_rank_ordered_to_an_earlier_boundary_reports_it_missed_and_stays_parked(rank):
    rt, ctl, sent = rank
    trainer = Trainer(rt, 8)
    park(rt, ctl, sent, trainer, 5)
    ctl._dispatch({"op": "hold", "boundary": 4})
    assert sent.next() == {"op": "hold_missed", "step": 5, "boundary": 4}
    assert rt.holding and rt.step_no == 5
    ctl._dispatch({"op": "release"})
    assert trainer.done.wait(10)


def test_a_running_rank_at_or_past_the_boundary_reports_it_missed_and_does_not_park_later(rank):
    rt, ctl, sent = rank
    trainer = Trainer(rt, 6)
    trainer.steps(3)
    trainer.wait_step(3)
    ctl._dispatch({"op": "hold", "boundary": 3})
    assert sent.next() == {"op": "hold_missed", "step": 3, "boundary": 3}
    trainer.steps(3)
    assert trainer.done.wait(10)
    assert sent.messages.empty()


def test_an_exit_order_at_the_parked_boundary_ends_the_rank_there(rank, monkeypatch):
    rt, ctl, sent = rank
    exited = []

    def fake_exit(code):
        exited.append((code, rt.step_no))
        raise SystemExit(code)

    monkeypatch.setattr("lockstep.runtime.context.os._exit", fake_exit)
    trainer = Trainer(rt, 8)
    park(rt, ctl, sent, trainer, 3)
    ctl._dispatch({"op": "hold", "boundary": 3, "exit": True})
    trainer.thread.join(10)
    assert exited == [(0, 3)] and not trainer.done.is_set()


def test_the_orchestrator_chooses_the_next_boundary_past_where_holding_and_missed_ranks_said_they_are(
        tmp_path, monkeypatch):
    from lockstep.orchestrator import core
    from lockstep.orchestrator.server import Orchestrator

    monkeypatch.setenv("LOCKSTEP_STATE_DIR", str(tmp_path))
    orch = Orchestrator(job="holds", token="t", world_size=2, nnodes=1, scheduler_name="local",
                        host="127.0.0.1", port=0, resume=False)
    parked, ran_on = orch.ranks[0], orch.ranks[1]
    parked.step = ran_on.step = 40  # the last heartbeats
    orch._from_rank(parked, None, {"op": "holding", "boundary": 50})
    orch._from_rank(ran_on, None, {"op": "hold_missed", "step": 57, "boundary": 50})
    assert (parked.holding_at, parked.step, ran_on.step) == (50, 50, 57)
    assert core.hold_boundary([r.step for r in orch.ranks.values()], 0.01, lead_s=1.5) > 57

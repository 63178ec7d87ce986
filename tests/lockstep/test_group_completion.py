"""How ``ResilientProcessGroup`` completes the collectives DDP hands it, in one process: gradient
buckets are completed on the thread that ran backward (no Python on the backend's thread), and
every op in issue order whatever order the backend finishes them in (gloo runs two at a time),
so a rank's progress is a prefix a recovery can line up with the other survivors'; a freeze
reports the ops in flight, and an op the old generation finishes or fails after the freeze is
re-run from its saved inputs, not taken from what the old generation left behind.

A world of one: gloo with a one-member group, or a scripted backend whose works the test
finishes by hand (``ScriptedBackend``), under DDP as ``lockstep run`` puts it there."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from lockstep.runtime import group as group_mod
from lockstep.runtime.group import ResilientProcessGroup


class Runtime:
    """What the group asks of a rank's runtime, recorded."""

    def __init__(self):
        self.first_grad_op_pending = True
        self._fault = None
        self.step_no = 0
        self.replaying = False
        self.errors: list[tuple[int, str]] = []
        self.error_seen = threading.Event()

    def on_first_grad_op(self):
        self.first_grad_op_pending = False

    def on_group_error(self, pg, generation, exc):
        self.errors.append((generation, str(exc)))
        self.error_seen.set()

    def note_unprotected(self, reason):
        raise AssertionError(reason)


def gloo_factory(generation):
    opts = dist.ProcessGroupGloo._Options()  # two threads, as the runtime builds it
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, opts)


class ScriptedWork:
    """A backend work with c10d's semantics (``wait(timeout)`` raises on a timeout or with the
    work's error; ``is_completed``; ``get_future``), finished by the test."""

    def __init__(self, tensors):
        self.tensors = tensors
        self.future = torch.futures.Future()

    def is_completed(self):
        return self.future.done()

    def get_future(self):
        return self.future

    def wait(self, timeout=None):
        deadline = None if not timeout else time.monotonic() + timeout.total_seconds()
        while not self.future.done():
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError("Operation timed out!")
            time.sleep(0.001)
        self.future.value()  # raises the work's error
        return True


class ScriptedBackend:
    """A one-member backend whose all-reduces finish when the test says: ``finish(i, scale)``
    multiplies the i-th one's tensors by ``scale`` and completes it, ``fail(i)`` fails it."""

    def __init__(self):
        self.calls: list[ScriptedWork] = []
        self.issued = threading.Condition()

    def allreduce(self, tensors, opts=None):
        work = ScriptedWork(tensors)
        with self.issued:
            self.calls.append(work)
            self.issued.notify_all()
        return work

    def broadcast(self, tensors, opts=None):
        work = ScriptedWork(tensors)
        work.future.set_result(tensors)
        return work

    def allgather(self, outputs, inputs, opts=None):
        for out, inp in zip(outputs, inputs, strict=True):
            for o in out:
                o.copy_(inp)
        work = ScriptedWork(outputs)
        work.future.set_result(outputs)
        return work

    def wait_calls(self, n, timeout=30.0):
        with self.issued:
            assert self.issued.wait_for(lambda: len(self.calls) >= n, timeout), f"{len(self.calls)} calls, wanted {n}"

    def finish(self, i, scale=1.0):
        work = self.calls[i]
        for t in work.tensors:
            t.mul_(scale)
        work.future.set_result(work.tensors)

    def fail(self, i):
        self.calls[i].future.set_exception(RuntimeError("Connection closed by peer"))


def make_group(factory, rt=None):
    return ResilientProcessGroup(rank=0, size=1, group_id="t", runtime=rt or Runtime(), backend_factory=factory,
                                 inner_name="gloo", timeout=datetime.timedelta(seconds=60), generation=0)


def wait_built(pg, generation=0, timeout=30.0):
    deadline = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if pg.generation == generation:
            return
        deadline.wait(0.01)
    raise AssertionError(f"generation {generation} was never built")


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 8))


@pytest.fixture
def completions(monkeypatch):
    """(grad, seq, thread) of every op as the group completes it."""
    seen: list[tuple[bool, int, int]] = []
    real = ResilientProcessGroup._complete

    def spy(ops):
        seen.extend((op.grad, op.seq, threading.get_ident()) for op in ops)
        real(ops)

    monkeypatch.setattr(ResilientProcessGroup, "_complete", staticmethod(spy))
    return seen


def test_gradient_buckets_are_completed_on_the_thread_running_backward_in_issue_order(completions):
    rt = Runtime()
    pg = make_group(gloo_factory, rt)
    wait_built(pg)
    plain = model()
    ddp = DDP(model(), process_group=pg, bucket_cap_mb=0.1)  # several buckets a step
    opt, plain_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (ddp, plain))
    for step in range(4):  # DDP's first step has one bucket, then it rebuilds them
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(step))
        for m, o in ((ddp, opt), (plain, plain_opt)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
        rt.step_no += 1
    main = threading.get_ident()
    grads = [(seq, thread) for grad, seq, thread in completions if grad]
    assert len(grads) >= 7, completions
    assert all(thread == main for _, thread in grads), completions
    seqs = [seq for _, seq, _ in completions]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # what DDP read is what the backend reduced: one member, so the plain model's own gradients
    for a, b in zip(ddp.module.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    report = pg.freeze()
    assert report["inflight"] == [] and report["done_seq"] == seqs[-1]


def test_a_bucket_the_backend_finished_during_a_freeze_is_re_run_by_the_recovery_not_completed_stale():
    backends = [ScriptedBackend(), ScriptedBackend()]
    rt = Runtime()
    pg = make_group(lambda generation: backends[generation], rt)
    wait_built(pg)
    layer = torch.nn.Linear(4, 1, bias=False)
    ddp = DDP(layer, process_group=pg)
    calls_before = len(backends[0].calls)
    errors: list[BaseException] = []

    def backward():
        try:
            ddp(torch.ones(1, 4)).sum().backward()
        except BaseException as exc:  # noqa: BLE001 (reported to the test thread)
            errors.append(exc)

    trainer = threading.Thread(target=backward)
    trainer.start()
    backends[0].wait_calls(calls_before + 1)
    report = pg.freeze()
    assert [op[2] for op in report["inflight"]] == ["allreduce"]
    backends[0].finish(calls_before, scale=100.0)  # the old generation finishes after the freeze
    pg.rebuild(1, rerun_from_seq=report["inflight"][0][0])
    backends[1].wait_calls(1)
    # the re-run starts from the saved input, not from what the old generation left behind
    assert torch.equal(backends[1].calls[0].tensors[0], torch.ones(4))
    backends[1].finish(0, scale=3.0)
    trainer.join(30)
    assert not trainer.is_alive() and errors == []
    assert torch.equal(layer.weight.grad, torch.full((1, 4), 3.0))


def test_a_bucket_whose_backend_fails_reports_the_error_and_completes_from_the_re_run():
    backends = [ScriptedBackend(), ScriptedBackend()]
    rt = Runtime()
    pg = make_group(lambda generation: backends[generation], rt)
    wait_built(pg)
    layer = torch.nn.Linear(4, 1, bias=False)
    ddp = DDP(layer, process_group=pg)
    calls_before = len(backends[0].calls)
    trainer = threading.Thread(target=lambda: ddp(torch.ones(1, 4)).sum().backward())
    trainer.start()
    backends[0].wait_calls(calls_before + 1)
    backends[0].fail(calls_before)
    assert rt.error_seen.wait(30)
    assert rt.errors[0][0] == 0 and "Connection closed" in rt.errors[0][1]
    report = pg.freeze()
    assert len(report["inflight"]) == 1
    pg.rebuild(1, rerun_from_seq=report["inflight"][0][0])
    backends[1].wait_calls(1)
    backends[1].finish(0, scale=2.0)
    trainer.join(30)
    assert not trainer.is_alive()
    assert torch.equal(layer.weight.grad, torch.full((1, 4), 2.0))


def test_a_failed_job_raises_group_lost_out_of_backward():
    backend = ScriptedBackend()
    pg = make_group(lambda generation: backend)
    wait_built(pg)
    ddp = DDP(torch.nn.Linear(4, 1, bias=False), process_group=pg)
    calls_before = len(backend.calls)
    raised: list[BaseException] = []

    def backward():
        try:
            ddp(torch.ones(1, 4)).sum().backward()
        except BaseException as exc:  # noqa: BLE001
            raised.append(exc)

    trainer = threading.Thread(target=backward)
    trainer.start()
    backend.wait_calls(calls_before + 1)
    pg.freeze()
    pg.fail("every rank was lost at once")
    trainer.join(30)
    assert not trainer.is_alive()
    assert raised and "every rank was lost at once" in str(raised[0])


def test_the_lazy_wait_looks_again_after_its_poll_while_the_backend_hangs(monkeypatch):
    """A backend work that never finishes (a peer lost without a reset) does not pin the
    waiting thread: after each poll it looks whether a recovery took the op over."""
    monkeypatch.setattr(group_mod, "_LAZY_POLL", datetime.timedelta(milliseconds=20))
    backends = [ScriptedBackend(), ScriptedBackend()]
    pg = make_group(lambda generation: backends[generation])
    wait_built(pg)
    layer = torch.nn.Linear(4, 1, bias=False)
    ddp = DDP(layer, process_group=pg)
    calls_before = len(backends[0].calls)
    trainer = threading.Thread(target=lambda: ddp(torch.ones(1, 4)).sum().backward())
    trainer.start()
    backends[0].wait_calls(calls_before + 1)
    report = pg.freeze()
    pg.rebuild(1, rerun_from_seq=report["inflight"][0][0])  # the old work never finishes
    backends[1].wait_calls(1)
    backends[1].finish(0, scale=5.0)
    trainer.join(30)
    assert not trainer.is_alive()
    assert torch.equal(layer.weight.grad, torch.full((1, 4), 5.0))


def test_an_all_reduce_that_python_code_in_backward_waits_for_completes_before_the_backward_ends():
    """Python in backward (a hook, a functional collective's backward) may wait for its own
    collective: only what a C++ autograd hook (DDP's reducer) issues is left to the final callback."""
    pg = make_group(gloo_factory)
    wait_built(pg)

    class SummedGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            pg.allreduce([grad]).wait()
            return grad * 2

    x = torch.ones(3, requires_grad=True)
    finished = threading.Event()

    def backward():
        SummedGrad.apply(x).sum().backward()
        finished.set()

    threading.Thread(target=backward, daemon=True).start()
    assert finished.wait(30), "the backward waited for its own all-reduce for ever"
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_an_op_the_backend_finishes_ahead_of_an_earlier_one_is_done_only_after_it():
    backends = [ScriptedBackend(), ScriptedBackend()]
    pg = make_group(lambda generation: backends[generation])
    wait_built(pg)
    first, second = torch.ones(2), torch.full((2,), 2.0)
    w1, w2 = pg.allreduce([first]), pg.allreduce([second])
    backends[0].wait_calls(2)
    backends[0].finish(1, scale=10.0)  # the second finishes first
    assert not w2.is_completed() and not w1.is_completed()
    report = pg.freeze()  # a peer is lost now: both are in flight
    assert [op[0] for op in report["inflight"]] == [1, 2] and report["done_seq"] == 0
    backends[0].finish(0, scale=10.0)  # the frozen generation finishes the first: ignored
    assert not w1.is_completed()
    pg.rebuild(1, rerun_from_seq=1)
    backends[1].wait_calls(2)
    # both re-run from their saved inputs, in issue order
    assert [w.tensors[0].tolist() for w in backends[1].calls] == [[1.0, 1.0], [2.0, 2.0]]
    backends[1].finish(1, scale=3.0)
    assert not w2.is_completed()
    backends[1].finish(0, scale=3.0)
    w1.wait()
    w2.wait()
    assert first.tolist() == [3.0, 3.0] and second.tolist() == [6.0, 6.0]
    assert pg.freeze()["done_seq"] == 2

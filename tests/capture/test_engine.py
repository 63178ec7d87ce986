"""The capture engine: exact staging, one capture in flight, bounded memory, a lost worker."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from lockstep.capture import CaptureFailed, CaptureInFlight, Layout
from lockstep.capture.sinks import tensor_digest

from .conftest import process_state, wait_for

DIGEST = "lockstep.capture.sinks:digest"


def sample_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(64, 48, generator=g)
    return {
        "weight": torch.randn(300, 200, generator=g),
        "transposed": base.t(),  # non-contiguous source
        "bf16": torch.randn(17, generator=g).to(torch.bfloat16),
        "int": torch.randint(-(2**40), 2**40, (33,), generator=g, dtype=torch.int64),
        "mask": torch.rand(29, generator=g) > 0.5,
        "scalar": torch.tensor(7.25),
        "empty": torch.empty(0, 5),
        "param": torch.nn.Parameter(torch.randn(8, 8, generator=g)),
    }


def test_capture_stages_every_tensor_byte_for_byte(engine):
    state = sample_state()
    handle = engine.capture(state, DIGEST, {})
    result = handle.wait(timeout=60)
    assert result["digests"] == {k: tensor_digest(v) for k, v in state.items()}
    assert result["bytes"] == sum(v.nbytes for v in state.values())


def test_tensors_may_change_as_soon_as_capture_returns(engine):
    state = sample_state()
    expected = {k: tensor_digest(v) for k, v in state.items()}
    handle = engine.capture(state, DIGEST, {})
    with torch.no_grad():
        for t in state.values():
            if t.numel() and t.dtype.is_floating_point:
                t.add_(1.0)
    assert handle.wait(timeout=60)["digests"] == expected


def test_arena_is_sized_to_the_capture_and_reused(engine):
    state = sample_state()
    engine.capture(state, DIGEST, {}).wait(timeout=60)
    size = Layout.of(state).nbytes
    assert engine.memory_bytes == size
    assert size < sum(v.nbytes for v in state.values()) + 256 * len(state)
    for _ in range(3):
        engine.capture(state, DIGEST, {}).wait(timeout=60)
    assert engine.memory_bytes == size
    bigger = {**state, "more": torch.randn(1000, 100)}
    engine.capture(bigger, DIGEST, {}).wait(timeout=60)
    assert engine.memory_bytes == Layout.of(bigger).nbytes


def test_second_capture_is_refused_or_waits_while_the_first_drains(engine, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_CAPTURE_FAULT", "stop:data:1")
    state = sample_state()
    first = engine.capture(state, DIGEST, {})
    pid = engine.worker_pid
    wait_for(lambda: process_state(pid) == "T", what="the worker to stop mid-capture")
    assert not first.done()

    with pytest.raises(CaptureInFlight):
        engine.capture(state, DIGEST, {}, block=False)

    seen = {}

    def second_capture():
        h = engine.capture(state, DIGEST, {})  # block=True: waits for the first
        seen["first_done_when_second_staged"] = first.done()
        seen["handle"] = h

    t = threading.Thread(target=second_capture)
    t.start()
    os.kill(pid, signal.SIGCONT)
    t.join(timeout=60)
    assert not t.is_alive()
    assert seen["first_done_when_second_staged"] is True
    assert first.wait(timeout=60)["bytes"] == seen["handle"].wait(timeout=60)["bytes"]


def test_a_killed_worker_fails_its_capture_and_is_replaced(engine, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_CAPTURE_FAULT", "stop:data:1")
    state = sample_state()
    handle = engine.capture(state, DIGEST, {})
    pid = engine.worker_pid
    wait_for(lambda: process_state(pid) == "T", what="the worker to stop mid-capture")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(CaptureFailed, match="killed by signal 9"):
        handle.wait(timeout=60)

    monkeypatch.delenv("LOCKSTEP_CAPTURE_FAULT")
    again = engine.capture(state, DIGEST, {})
    assert engine.worker_pid != pid
    assert again.wait(timeout=60)["digests"]["weight"] == tensor_digest(state["weight"])


def test_bad_inputs_name_the_key(engine):
    with pytest.raises(TypeError, match="'w'.*sparse"):
        engine.capture({"w": torch.eye(3).to_sparse()}, DIGEST, {})
    with pytest.raises(ValueError, match="'m'.*meta"):
        engine.capture({"m": torch.empty(3, device="meta")}, DIGEST, {})
    with pytest.raises(TypeError, match="'x'.*list"):
        engine.capture({"x": [1, 2]}, DIGEST, {})


@pytest.mark.parametrize("pull", [True, False], ids=["worker-reads-memory", "copy-thread"])
def test_overlapped_capture_holds_the_next_optimizer_step_until_it_is_staged(pull):
    # 200 MB: copying takes far longer than reaching optimizer.step(), which changes every
    # weight in place at once; without the hook the capture would catch weights mid-update.
    from lockstep.capture import Engine

    engine = Engine(name="test-overlap", pull=pull)
    try:
        engine.capture({"warm": torch.zeros(4)}, DIGEST, {}).wait(timeout=120)
        assert engine.worker_reads_memory is True  # no Yama/seccomp limits on this machine
        params = [torch.nn.Parameter(torch.full((12_500_000,), float(i))) for i in range(4)]
        for p in params:
            p.grad = torch.ones_like(p)
        optim = torch.optim.SGD(params, lr=1.0)
        state = {f"p{i}": p for i, p in enumerate(params)}
        expected = {k: tensor_digest(v) for k, v in state.items()}
        handle = engine.capture(state, DIGEST, {}, overlap=True)
        assert handle.pulled is pull
        optim.step()
        assert handle.staged
        assert handle.wait(timeout=120)["digests"] == expected
        assert torch.equal(params[3], torch.full((12_500_000,), 2.0))  # the step did run, after
    finally:
        engine.close()

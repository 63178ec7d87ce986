"""What a fast-forwarding replacement does not repeat (``lockstep.runtime.replay.SideEffects``)."""

from __future__ import annotations

import sys
import traceback

import torch

from lockstep.runtime.replay import DEFERRED_SEED_MODULES, SideEffects


def test_while_fast_forwarding_a_deferred_device_seed_is_still_queued_but_its_stack_is_not_recorded(tmp_path):
    assert not torch.cuda.is_initialized()  # the CPU build: torch defers every CUDA seed
    effects = SideEffects()
    effects.suppress()
    try:
        torch.manual_seed(1234)
        _, stack = torch.cuda._lazy_seed_tracker.manual_seed_all_cb
        assert stack == ["  (stack not recorded while Lockstep fast-forwarded)\n"]
        with open(tmp_path / "out.txt", "w") as f:  # and files opened for writing go nowhere
            f.write("x")
        assert not (tmp_path / "out.txt").exists()
    finally:
        effects.restore()
    for name in DEFERRED_SEED_MODULES:
        assert sys.modules[name].traceback is traceback
    torch.manual_seed(1234)
    _, stack = torch.cuda._lazy_seed_tracker.manual_seed_all_cb
    assert any("test_side_effects.py" in frame for frame in stack)  # torch's own record, as before
    assert torch.initial_seed() == 1234

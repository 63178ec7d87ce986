"""The checkpoint adapters, each run inside an environment that has its framework installed.

TorchTitan, DeepSpeed and Megatron-Core do not belong in the project's own .venv (see requirements/adapters.txt);
``scripts/adapter-venvs.sh`` builds var/adapters/<name> with the pinned CPU torch, and these tests
run the scenarios (tests/capture/adapters_*.py) with those interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from .conftest import REPO, child_env

VENVS = REPO / "var" / "adapters"


def wait_for_a_build_beside_the_suite():
    """.ci/run builds the environments in the background while the suite runs and names the
    status file its build writes when done (0: built); a plain `make test` built them before."""
    status = os.environ.get("LOCKSTEP_ADAPTERS_BUILD_STATUS")
    if not status:
        return
    path = REPO / status
    deadline = time.monotonic() + 780  # inside the first adapter test's 900 s timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the adapter environments' build did not write {path} within 13 minutes")
        time.sleep(0.5)
    if path.read_text().strip() != "0":
        log = REPO / "var" / "adapters-build.log"
        tail = log.read_text()[-3000:] if log.exists() else "(no log)"
        pytest.fail(f"the adapter environments' build failed ({path}):\n{tail}")


def interpreter(name: str):
    wait_for_a_build_beside_the_suite()
    python = VENVS / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{name} is not installed here: scripts/adapter-venvs.sh builds {python.parent.parent}")
    return python


def run(cmd, timeout=840) -> dict:
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
@pytest.mark.timeout(900)  # torchrun, two ranks importing TorchTitan: minutes on a busy machine
@pytest.mark.parametrize("mode", ["async", "async_with_pinned_mem"])
def test_torchtitan_checkpoint_manager_saves_through_lockstep_and_loads_back(tmp_path, mode):
    python = interpreter("torchtitan")
    torchrun = python.parent / "torchrun"
    out = run([str(torchrun), "--nproc-per-node", "2", str(REPO / "tests/capture/adapters_torchtitan.py"), str(tmp_path), mode])
    assert out["futures"][1:] == ["SaveFuture"] * 5  # every async save went through lockstep
    assert out["loaded_step"] == 6 and out["same_model"] and out["same_optim"] and out["sched"] == 6
    # TorchTitan's keep_latest_k=2 purges right after each save call; the save still being written
    # is not visible yet (published atomically), so one older checkpoint may be kept a save longer.
    kept = set(os.listdir(tmp_path / "ck"))
    assert {"step-4", "step-6"} <= kept <= {"step-2", "step-4", "step-6"}, kept


@pytest.mark.slow
@pytest.mark.timeout(900)  # DeepSpeed's import, in the trainer and then in the writer
def test_deepspeed_checkpoint_engine_publishes_then_names_latest_and_loads_back(tmp_path):
    python = interpreter("deepspeed")
    out = run([str(python), str(REPO / "tests/capture/adapters_deepspeed.py"), str(tmp_path)])
    assert out["files_right_after"] == [] and out["latest_right_after"] is False  # save returned first
    assert out["files"] == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert out["latest"] == "step3" and out["loaded"] and out["same_model"] and out["global_steps"] == 3


@pytest.mark.slow
@pytest.mark.timeout(900)  # torchrun, two ranks importing Megatron-Core, three writer processes each
def test_megatron_save_strategy_writes_torch_dist_through_lockstep_and_loads_back(tmp_path):
    python = interpreter("megatron")
    torchrun = python.parent / "torchrun"
    ranks = run([str(torchrun), "--nproc-per-node", "2", str(REPO / "tests/capture/adapters_megatron.py"), str(tmp_path)])["ranks"]
    for out in ranks:
        # async: returned with the writers frozen mid-write, not complete, not finalized until they went on
        assert out["complete_while_writing"] is False and out["finalized_while_writing"] == []
        assert out["finalized"] == [0] and out["complete_after"] and out["sync_complete"]
        # kill -9 mid-write: finalizing fails, no metadata.json, Megatron refuses it
        assert out["crash_finalize"] == "CaptureFailed" and out["crash_complete"] is False
        assert out["crash_load"] == "CheckpointingException"
        # Megatron's own load, into models built with other weights: bitwise
        assert out["same_first"] and out["same_second"] and out["differs"] and out["rng"]
        assert (out["iteration_first"], out["iteration_second"]) == (1, 2)
        assert out["dcp_slice"]  # torch.distributed.checkpoint.load reads it too
        assert out["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "common.pt", "lockstep.json", "metadata.json"]

"""Reading torchrun command lines."""

import pytest

from lockstep.orchestrator import launchspec


def test_a_single_node_command_line():
    spec = launchspec.parse(["torchrun", "--nproc-per-node", "4", "train.py", "out.pt", "--lr", "1e-3"])
    assert (spec.nnodes, spec.nproc_per_node, spec.node_rank, spec.world_size) == (1, 4, 0, 4)
    assert spec.worker_argv() == ["train.py", "out.pt", "--lr", "1e-3"]
    assert spec.master_port == launchspec.DEFAULT_MASTER_PORT


def test_the_multi_node_form_and_python_dash_m():
    spec = launchspec.parse(["python", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2",
                             "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29611", "-m", "pkg.train"])
    assert (spec.nnodes, spec.node_rank, spec.master_addr, spec.master_port) == (2, 1, "10.0.0.1", 29611)
    assert spec.worker_argv() == ["-m", "pkg.train"]


def test_a_c10d_endpoint_without_node_rank_leaves_it_to_the_rendezvous():
    spec = launchspec.parse(["torchrun", "--nnodes", "3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", "head:29400", "--rdzv-id", "exp7", "t.py"])
    assert spec.node_rank is None and spec.master_addr == "head" and spec.master_port == 29400
    assert spec.rdzv_id == "exp7"


@pytest.mark.parametrize(("argv", "message"), [
    (["torchrun", "--nnodes", "1:4", "t.py"], "elastic node counts"),
    (["torchrun", "--no-python", "./run.sh"], "--no-python"),
    (["torchrun", "--nproc-per-node", "0", "t.py"], "at least 1"),
    (["torchrun", "--nnodes", "2", "--node-rank", "5", "t.py"], "--node-rank 5"),
    (["torchrun", "--redirects", "3", "t.py"], "--redirects 3"),
    (["mpirun", "-n", "4", "t.py"], "expected a torchrun command"),
    ([], "no command after"),
])
def test_bad_command_lines_are_refused_naming_the_flag(argv, message):
    with pytest.raises(launchspec.LaunchError, match=message):
        launchspec.parse(argv)


def test_the_worker_environment_is_torchruns():
    spec = launchspec.parse(["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "--node-rank", "1",
                             "--master-addr", "h", "--master-port", "1234", "t.py"])
    env = launchspec.worker_env(spec, rank=6, local_rank=2, node_rank=1, run_id="j", base={})
    assert env["RANK"] == "6" and env["LOCAL_RANK"] == "2" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "h" and env["MASTER_PORT"] == "1234"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True" and env["OMP_NUM_THREADS"] == "1"
    assert launchspec.worker_env(spec, rank=0, local_rank=0, node_rank=0, run_id="j",
                                 base={"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "8"

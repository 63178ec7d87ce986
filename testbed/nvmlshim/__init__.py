"""Agents in the emulated testbed that see GPUs: a ``pynvml`` stand-in backed by the NVML fake.

The agent imports ``pynvml`` (``agent.inventory.gpus.load_nvml``); with ``site/`` first on its
``PYTHONPATH`` it gets ``site/pynvml.py``, which serves ``tests/agent/fakes/nvml_fake.py``
(the faithful FAKE of nvidia-ml-py) for the machine named by ``LOCKSTEP_FAKE_NVML``, with the
defects listed in ``<agent dir>/nvml.json`` (the ``node-gpu`` fault writes them; the file is
re-read at every ``nvmlInit``, so a defect shows at the agent's next NVML use, no restart).

    fab.start_agents(console_url=..., token=..., env=nvmlshim.agent_env("hgx_h100"))
    python -m testbed agents start --fake-nvml hgx_h100 ...
    python -m testbed fault node-gpu node0001 --defect remap-pending --gpu 2

The real path is unchanged: on a GPU node the agent imports the real pynvml.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SITE = Path(__file__).resolve().parent / "site"
FAKE_MODULE = REPO_ROOT / "tests" / "agent" / "fakes" / "nvml_fake.py"
MACHINE_ENV = "LOCKSTEP_FAKE_NVML"
MACHINES = ("hgx_h100", "dgx_h100", "l40s")


def agent_env(machine: str = "hgx_h100") -> dict[str, str]:
    """Environment for `Fabric.start_agents(env=...)`: the shim first on the path, the machine."""
    if machine not in MACHINES:
        raise ValueError(f"machine {machine!r}: use one of {', '.join(MACHINES)}")
    return {"PYTHONPATH": f"{SITE}:{REPO_ROOT}", MACHINE_ENV: machine}


def spec_path(state_dir: Path) -> Path:
    """Where the fake's defects of one agent live: beside its state directory."""
    return Path(state_dir).parent / "nvml.json"


def load_fake_module():
    """The fake, imported from its file (tests/ is not a package path for the agent)."""
    name = "lockstep_testbed_nvml_fake"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FAKE_MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def check_defect(machine: str, gpu: int, defect: str) -> None:
    """ValueError naming what is wrong with a defect for a machine (unknown kind, no such GPU)."""
    fake = load_fake_module()
    if defect not in fake.DEFECTS:
        raise ValueError(f"defect {defect!r}: use one of {', '.join(fake.DEFECTS)}")
    fake.FakeNvml.from_spec({"machine": machine, "defects": {str(gpu): defect}})

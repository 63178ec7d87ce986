"""A FAKE ``pynvml`` for agents in the emulated testbed (see ``testbed/nvmlshim/__init__.py``).

Every attribute is the NVML fake's (``tests/agent/fakes/nvml_fake.py``) for the machine in
``$LOCKSTEP_FAKE_NVML``, with the defects of ``<dirname $LOCKSTEP_STATE_DIR>/nvml.json``,
re-read at each ``nvmlInit``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from testbed.nvmlshim import MACHINE_ENV, load_fake_module, spec_path

_module = load_fake_module()
_lock = threading.Lock()
_fake = None
_loaded_mtime: float | None = -1.0


def _spec_file() -> Path | None:
    state = os.environ.get("LOCKSTEP_STATE_DIR")
    return spec_path(Path(state)) if state else None


def _current():
    global _fake, _loaded_mtime
    with _lock:
        path = _spec_file()
        try:
            mtime = path.stat().st_mtime if path else None
        except FileNotFoundError:
            mtime = None
        if _fake is None or mtime != _loaded_mtime:
            spec = {"machine": os.environ.get(MACHINE_ENV, "hgx_h100")}
            if mtime is not None:
                spec |= json.loads(path.read_text())
            fresh = _module.FakeNvml.from_spec(spec)
            if _fake is None:
                _fake = fresh
            else:  # keep the instance (its init count), swap what the GPUs report
                _fake.gpus, _fake.driver_version, _fake.cuda_version = fresh.gpus, fresh.driver_version, fresh.cuda_version
            _loaded_mtime = mtime
        return _fake


def nvmlInit() -> None:  # noqa: N802 - pynvml's name
    _current().nvmlInit()


def __getattr__(name: str):
    return getattr(_current(), name)

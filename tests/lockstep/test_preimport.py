"""What a warm spare imports while it waits: the library modules a node's worker has imported,
listed after its first step (``lockstep.runtime.preimport``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from lockstep.runtime import preimport
from lockstep.runtime.context import Runtime

ROOT = Path(__file__).resolve().parents[2]


def module(path):
    mod = types.ModuleType("m")
    mod.__file__ = path
    return mod


def test_the_list_names_library_modules_in_import_order_and_leaves_out_the_scripts_own_lockstep_and_main(tmp_path):
    lib, script = tmp_path / "site-packages", tmp_path / "job"
    modules = {
        "numpy": module(str(lib / "numpy" / "__init__.py")),
        "model": module(str(script / "model.py")),  # the script's own: it may read RANK at import
        "__main__": module(str(lib / "runner.py")),
        "lockstep.runtime": module(str(lib / "lockstep" / "runtime" / "__init__.py")),
        "sys": types.ModuleType("sys"),  # built in: no file
        "numpy.linalg": module(str(lib / "numpy" / "linalg" / "__init__.py")),
        "site-packagesx": module(str(tmp_path / "site-packagesx" / "a.py")),  # a prefix, not a directory
    }
    assert preimport.library_modules(modules, [str(lib)]) == ["numpy", "numpy.linalg"]


def test_the_library_roots_hold_the_standard_library_and_the_installed_packages_but_not_the_tests():
    listed = preimport.library_modules(sys.modules, preimport.library_roots())
    assert {"json", "torch", "pytest"} <= set(listed)
    assert not any(n == "tests" or n.startswith("tests.") for n in listed)


def test_a_missing_oversized_malformed_or_non_list_file_reads_as_no_list(tmp_path):
    assert preimport.read(str(tmp_path)) is None
    path = tmp_path / preimport.FILE
    for content in (b"[" * 10, b'{"numpy": 1}', b'["numpy", 3]', b'["x"' + b', "x"' * (preimport.MAX_BYTES // 5) + b"]"):
        path.write_bytes(content)
        assert preimport.read(str(tmp_path)) is None, content[:40]
    preimport.write(str(tmp_path), ["numpy", "json"])
    assert preimport.read(str(tmp_path)) == ["numpy", "json"]
    assert sorted(os.listdir(tmp_path)) == [preimport.FILE]  # the temporary file is gone


def test_a_module_that_fails_to_import_is_skipped_and_the_others_are_imported_once(tmp_path, monkeypatch):
    (tmp_path / "lockstep_test_good.py").write_text("LOADS = []\nLOADS.append(1)\n")
    (tmp_path / "lockstep_test_bad.py").write_text("raise SystemExit('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lockstep_test_good", "lockstep_test_bad"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    done: set[str] = set()
    names = ["lockstep_test_bad", "lockstep_test_good", "lockstep_test_absent"]
    assert preimport.import_all(names, done) == 1
    assert preimport.import_all(names, done) == 0
    assert sys.modules["lockstep_test_good"].LOADS == [1]
    assert "lockstep_test_bad" not in sys.modules and done == set(names)
    monkeypatch.delitem(sys.modules, "lockstep_test_good")


def marker(tmp_path, name: str) -> str:
    """A module on the spare's path that leaves ``tmp_path/<name>.imported`` behind when imported."""
    (tmp_path / f"{name}.py").write_text(f"open({str(tmp_path / (name + '.imported'))!r}, 'w').close()\n")
    return name


def start_spare(tmp_path, listed=None, extra_env=None):
    """A warm spare of the node directory ``tmp_path/node`` (holding ``listed`` before it starts)
    and the order that makes it a rank running a script that prints which markers it found imported."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    if listed is not None:
        preimport.write(str(node_dir), listed)
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(sorted(n for n in sys.modules if n.startswith('lockstep_test_marker')))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update({"LOCKSTEP_NODE_DIR": str(node_dir), "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
                **(extra_env or {})})
    proc = subprocess.Popen([sys.executable, "-m", "lockstep.runtime.spare"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    order = {"argv": [str(script)], "env": {"PATH": os.environ["PATH"], "PYTHONPATH": env["PYTHONPATH"]},
             "cwd": str(tmp_path)}
    return proc, node_dir, json.dumps(order) + "\n"


def become_rank(proc, order) -> str:
    out, err = proc.communicate(order, timeout=120)
    assert proc.returncode == 0, err
    return out.strip()


def wait_imported(proc, tmp_path, name):
    deadline = time.monotonic() + 120
    while not (tmp_path / f"{name}.imported").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the waiting spare never imported {name}")
        time.sleep(0.05)


def test_a_warm_spare_imports_the_list_it_finds_before_it_becomes_a_rank(tmp_path):
    first = marker(tmp_path, "lockstep_test_marker1")
    proc, _, order = start_spare(tmp_path, [first, "lockstep_no_such_module"])
    assert become_rank(proc, order) == "['lockstep_test_marker1']"


def test_a_warm_spare_imports_what_a_newer_list_adds_while_it_waits(tmp_path):
    first, second = marker(tmp_path, "lockstep_test_marker1"), marker(tmp_path, "lockstep_test_marker2")
    proc, node_dir, order = start_spare(tmp_path)
    preimport.write(str(node_dir), [first])
    wait_imported(proc, tmp_path, first)
    preimport.write(str(node_dir), [first, second])  # the worker imported more since
    wait_imported(proc, tmp_path, second)
    assert become_rank(proc, order) == "['lockstep_test_marker1', 'lockstep_test_marker2']"


def test_a_warm_spare_told_not_to_preimport_imports_nothing_listed(tmp_path):
    first = marker(tmp_path, "lockstep_test_marker1")
    proc, _, order = start_spare(tmp_path, [first], {"LOCKSTEP_SPARE_PREIMPORT": "0"})
    assert become_rank(proc, order) == "[]"


def test_a_nodes_first_worker_lists_its_libraries_after_its_first_step_and_again_only_when_it_imported_more(tmp_path):
    rt = Runtime({"RANK": "0", "WORLD_SIZE": "1"})
    rt.node_dir = str(tmp_path)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    listed = tmp_path / preimport.FILE

    def step():
        rt.on_pre_step(opt)
        rt.on_post_step(opt)

    step()
    names = json.loads(listed.read_text())
    assert "torch" in names and "json" in names and not any(n.startswith("lockstep") for n in names)
    listed.unlink()
    for _ in range(32):  # steps 2..33: the list is due again at 33, but nothing new was imported
        step()
    assert not listed.exists()
    sys.modules["lockstep_test_new_library"] = module(str(Path(torch.__file__).parent / "new_library.py"))
    try:
        for _ in range(32):  # steps 34..65
            step()
        assert "lockstep_test_new_library" in json.loads(listed.read_text())
    finally:
        del sys.modules["lockstep_test_new_library"]

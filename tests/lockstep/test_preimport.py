"""What a warm spare imports while it waits: the library modules a node's worker has imported,
listed after its first step (``lockstep.runtime.preimport``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def run_spare(tmp_path, listed, extra_env):
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    preimport.write(str(node_dir), listed)
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(sorted(n for n in sys.modules if n.startswith('xml.dom')))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update({"LOCKSTEP_NODE_DIR": str(node_dir), "PYTHONPATH": str(ROOT), **extra_env})
    order = {"argv": [str(script)], "env": {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}, "cwd": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "lockstep.runtime.spare"], input=json.dumps(order) + "\n",
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_warm_spare_imports_the_listed_libraries_before_it_becomes_a_rank(tmp_path):
    assert run_spare(tmp_path, ["xml.dom.minidom", "lockstep_no_such_module"], {}) == \
        "['xml.dom', 'xml.dom.NodeFilter', 'xml.dom.domreg', 'xml.dom.minicompat', 'xml.dom.minidom', 'xml.dom.xmlbuilder']"


def test_a_warm_spare_told_not_to_preimport_imports_nothing_listed(tmp_path):
    assert run_spare(tmp_path, ["xml.dom.minidom"], {"LOCKSTEP_SPARE_PREIMPORT": "0"}) == "[]"


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

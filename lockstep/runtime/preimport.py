"""The libraries a warm spare imports before it is needed.

A replacement runs the script from the top, so every import the script makes is on the path from
a failure to resumed training. A warm spare imports torch ahead of time, but a script's own
imports go further (``torch.distributed.checkpoint`` alone pulls in DTensor and sympy: ~1 s of a
2 s recovery here, py-spy of a replacement, 2026-12-04). So a worker of each node lists the
library modules it has imported, and the node's warm spares import the same ones while they wait.

Only modules loaded from the interpreter's library directories (the standard library and
site-packages) are listed: the script's own modules stay for the replacement to import as its
rank, since a module of the script may read its rank (``RANK``, ``LOCAL_RANK``) at import time and
a spare does not know yet which rank it will be. ``LOCKSTEP_SPARE_PREIMPORT=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import site
import sysconfig

FILE = "modules.json"
MAX_BYTES = 4 << 20  # a torch process lists ~2,500 names, ~90 KB


def library_roots() -> list[str]:
    """The standard library and every site directory (a distribution's own, such as Debian's
    ``dist-packages``, and the user's), where installed libraries live."""
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    roots += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        roots.append(site.getusersitepackages())
    return sorted({os.path.realpath(r) for r in roots})


def library_modules(modules: dict, roots: list[str]) -> list[str]:
    """Names of the modules in ``modules`` (``sys.modules``, in import order) loaded from under
    one of ``roots``; Lockstep's own and ``__main__`` left out."""
    prefixes = tuple(r.rstrip(os.sep) + os.sep for r in roots)
    names = []
    for name, mod in list(modules.items()):
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or name == "__main__" or name == "lockstep" or name.startswith("lockstep."):
            continue
        if os.path.realpath(path).startswith(prefixes):
            names.append(name)
    return names


def write(node_dir: str, names: list[str]):
    """Replace the node's list at once (a spare never reads half of one)."""
    path = os.path.join(node_dir, FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(names, f)
    os.replace(tmp, path)


def read(node_dir: str) -> list[str] | None:
    """The node's list, or None when there is none (yet) or it is not a list of names."""
    try:
        with open(os.path.join(node_dir, FILE), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    try:
        names = json.loads(data)
    except ValueError:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return names


def import_all(names: list[str], done: set[str]) -> int:
    """Import each name not in ``done`` (adding it there); a module that fails to import on its
    own is skipped: the replacement imports it in the script's order, as the rank did."""
    n = 0
    for name in names:
        if name in done:
            continue
        done.add(name)
        with contextlib.suppress(Exception, SystemExit):
            importlib.import_module(name)
            n += 1
    return n

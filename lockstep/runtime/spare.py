"""A warm spare: ``python -m lockstep.runtime.spare``, kept waiting by ``lockstep run --spares N``.

It imports torch and the runtime, then waits for one JSON line on stdin:
``{"argv": [...], "env": {...}, "cwd": "..."}`` -- the command line and environment of the rank
it is to become -- and runs it exactly as ``python -m lockstep.runtime.launch ARGV`` would. An
empty stdin (the supervisor exited) ends it. While it waits it imports the libraries the node's
workers have imported (``preimport``), so a replacement does not spend its recovery on them.
"""

from __future__ import annotations

import json
import os
import select
import sys

# How often a waiting spare looks for a new list of the workers' libraries: a stat() per second.
PREIMPORT_POLL_S = 1.0


def wait_for_order(node_dir: str | None) -> str:
    """The order line, importing the node's list of libraries (and each new one) meanwhile."""
    from lockstep.runtime import preimport

    done: set[str] = set()
    seen = None
    watch = bool(node_dir) and os.environ.get("LOCKSTEP_SPARE_PREIMPORT", "1") != "0"
    while watch:
        try:
            mtime = os.stat(os.path.join(node_dir, preimport.FILE)).st_mtime_ns
        except OSError:
            mtime = None
        if mtime is not None and mtime != seen:
            seen = mtime
            preimport.import_all(preimport.read(node_dir) or [], done)
        ready, _, _ = select.select([sys.stdin], [], [], PREIMPORT_POLL_S)
        if ready:
            break
    return sys.stdin.readline()


def main():
    import torch  # noqa: F401  (the point of a warm spare)
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data  # noqa: F401

    from lockstep.runtime import launch

    line = wait_for_order(os.environ.get("LOCKSTEP_NODE_DIR"))
    if not line.strip():
        os._exit(0)
    order = json.loads(line)
    os.environ.clear()
    os.environ.update(order["env"])
    if order.get("cwd"):
        os.chdir(order["cwd"])
    sys.stdin.close()
    launch.main(order["argv"])


if __name__ == "__main__":
    main()

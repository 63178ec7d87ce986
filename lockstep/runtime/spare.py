"""A warm spare: ``python -m lockstep.runtime.spare``, kept waiting by ``lockstep run --spares N``.

It imports torch and the runtime, then blocks reading one JSON line on stdin:
``{"argv": [...], "env": {...}, "cwd": "..."}`` -- the command line and environment of the rank
it is to become -- and runs it exactly as ``python -m lockstep.runtime.launch ARGV`` would. An
empty stdin (the supervisor exited) ends it.
"""

from __future__ import annotations

import json
import os
import sys


def main():
    import torch  # noqa: F401  (the point of a warm spare)
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data  # noqa: F401

    from lockstep.runtime import launch

    line = sys.stdin.readline()
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

"""Run a training script under the Lockstep runtime: ``python -m lockstep.runtime.launch SCRIPT ARGS``
(or ``-m MODULE ARGS``), what ``lockstep run`` starts for every rank instead of ``python SCRIPT``.

Why a launcher and not ``sitecustomize``: a ``sitecustomize.py`` on the worker's path would
shadow (or be shadowed by) one the user already has, and anything imported that way runs in
every Python process the script starts (data-loader workers, compilers). The launcher imports
only ``lockstep.runtime.*``, installs its hooks, then runs the script exactly as ``python``
would -- ``__main__``, ``sys.argv``, ``sys.path[0]`` the script's directory -- with ``runpy``.
The script's exit status is the process's, as with ``python``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import sys
import traceback
import uuid


def _exit(code: int):
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()
        # Skip interpreter teardown: destroying a communicator whose peers are gone can abort.
        os._exit(code)


def _code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def prepare(argv: list[str]):
    """Install the runtime for this process; returns the runtime."""
    from lockstep.runtime import context, patches
    from lockstep.runtime.context import Runtime

    rt = Runtime(dict(os.environ))
    context.RUNTIME = rt
    if os.environ.get("LOCKSTEP_RESTORE") and rt.role == "worker":
        from lockstep.runtime import snapshot

        snapshot.prepare_restore(rt, os.environ["LOCKSTEP_RESTORE"])
    patches.install(rt)
    addr = os.environ.get("LOCKSTEP_ORCHESTRATOR")
    if addr:
        from lockstep.runtime.control import Controller

        token = os.environ.get("LOCKSTEP_JOB_TOKEN", "")
        if rt.role == "replacement":
            from lockstep.runtime.replacement import Plan

            # Before the controller connects: the plan is the first thing it is sent.
            rt.plan = Plan(rt, None, token)
        rt.controller = Controller(rt, addr, token, os.environ.get("LOCKSTEP_INCARNATION") or uuid.uuid4().hex)
        if rt.role == "replacement":
            rt.plan.controller = rt.controller
            rt.plan.wait_for(lambda: rt.plan.resume_at is not None or rt.plan.ff_limit is not None, "plan")
            if rt.plan.resume_at == 0:
                # Lost before its first step: replay from the start, nothing to load.
                rt.plan.wait_for(lambda: rt.plan.live_after is not None and rt.plan.generation is not None,
                                 "recovery plan")
                rt.live_after = dict(rt.plan.live_after)
                rt.phase = "replay"
                rt.controller.send({"op": "resumed", "step": 0, "exact": True})
            else:
                rt.side_effects.suppress()
    return rt


def run_script(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m lockstep.runtime.launch SCRIPT [ARGS] | -m MODULE [ARGS]", file=sys.stderr)
        return 2
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                print("lockstep: -m needs a module name", file=sys.stderr)
                return 2
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = [script, *argv[1:]]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return _code_of(exc)
    except BaseException:
        from lockstep.runtime import context

        rt = context.RUNTIME
        if rt is not None:
            rt.side_effects.restore()
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("LOCKSTEP_DEBUG_STACKS"):
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1, all_threads=True)
    rt = prepare(argv)
    code = run_script(argv)
    if rt.controller is not None:
        rt.controller.send({"op": "exit", "code": code, "step": rt.step_no})
    _exit(code)


if __name__ == "__main__":
    main()

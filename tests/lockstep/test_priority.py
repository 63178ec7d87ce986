"""A shadow's CPU priority: idle while it follows, normal again once adopted, and never lowered
where the process could not return (a rank stuck at idle priority would slow the whole job)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from lockstep.runtime import priority

# Leaving SCHED_IDLE needs root here (these machines and the CI run as root).


def test_a_started_process_is_put_at_idle_priority_and_the_threads_it_starts_follow():
    probe = ("import os, threading, time; seen = []; "
             "t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0))); t.start(); t.join(); "
             "print(os.sched_getscheduler(0) == os.SCHED_IDLE, seen[0] == os.SCHED_IDLE)")
    # The child waits on stdin, so it is lowered before it starts its thread.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); " + probe],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert priority.lower(child.pid)
    out, _ = child.communicate("go\n", timeout=60)
    assert out.split() == ["True", "True"]


def test_restore_all_puts_every_thread_of_the_process_back_at_normal_priority():
    probe = ("import os, threading; from lockstep.runtime import priority; "
             "assert priority.lower(0); ev = threading.Event(); done = threading.Event(); seen = []; "
             "t = threading.Thread(target=lambda: (ev.wait(), seen.append(os.sched_getscheduler(0)), done.set())); "
             "t.start(); priority.restore_all(); ev.set(); done.wait(); "
             "print(os.sched_getscheduler(0) == os.SCHED_OTHER, seen[0] == os.SCHED_OTHER)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.split() == ["True", "True"]


def test_a_process_that_could_not_return_to_normal_priority_is_never_lowered(monkeypatch):
    monkeypatch.setattr(priority, "can_restore", lambda: False)
    before = os.sched_getscheduler(threading.get_native_id())
    assert priority.lower(0) is False
    assert os.sched_getscheduler(threading.get_native_id()) == before


def test_can_restore_follows_the_nice_limit_for_an_unprivileged_user(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(priority.resource, "getrlimit", lambda _r: (0, 0))
    assert priority.can_restore() is False
    monkeypatch.setattr(priority.resource, "getrlimit", lambda _r: (20, 20))
    assert priority.can_restore() is True

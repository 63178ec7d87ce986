"""A shadow's CPU priority: idle while it follows, normal again once adopted, and never lowered
where the process could not return (a rank stuck at idle priority would slow the whole job)."""

from __future__ import annotations

import os
import subprocess
import sys

from lockstep.runtime import priority

# Leaving SCHED_IDLE needs root here (these machines and the CI run as root).


def test_a_process_started_at_idle_priority_starts_its_threads_there_too():
    probe = ("import os, threading; seen = []; "
             "t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0))); t.start(); t.join(); "
             "print(os.sched_getscheduler(0) == os.SCHED_IDLE, seen[0] == os.SCHED_IDLE)")
    out = subprocess.run([sys.executable, "-c", probe], preexec_fn=priority.lower_self, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_restore_all_puts_every_thread_of_the_process_back_at_normal_priority():
    probe = ("import os, threading; from lockstep.runtime import priority; "
             "priority.lower_self(); ev = threading.Event(); done = threading.Event(); seen = []; "
             "t = threading.Thread(target=lambda: (ev.wait(), seen.append(os.sched_getscheduler(0)), done.set())); "
             "t.start(); priority.restore_all(); ev.set(); done.wait(); "
             "print(os.sched_getscheduler(0) == os.SCHED_OTHER, seen[0] == os.SCHED_OTHER)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.split() == ["True", "True"]


def test_can_restore_follows_the_nice_limit_for_an_unprivileged_user(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(priority.resource, "getrlimit", lambda _r: (0, 0))
    assert priority.can_restore() is False
    monkeypatch.setattr(priority.resource, "getrlimit", lambda _r: (20, 20))
    assert priority.can_restore() is True

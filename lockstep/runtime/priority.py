"""CPU priority of a shadow (a replacement fast-forwarding behind a live rank, ``replacement``).

A shadow runs at ``SCHED_IDLE`` while it follows, so on a host whose cores the job's ranks
fill it takes only the cycles they leave; once it is adopted it must run as a rank again, and
Linux lets a process leave ``SCHED_IDLE`` only with ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` of
20. Where it could not return, it is never lowered (a rank stuck at idle priority would slow
the whole job)."""

from __future__ import annotations

import contextlib
import os
import resource


def can_restore() -> bool:
    if os.geteuid() == 0:
        return True
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return soft == resource.RLIM_INFINITY or soft >= 20


def lower_self() -> None:
    """This thread, and the threads it starts later, at idle priority (a ``preexec_fn``)."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def restore_all() -> None:
    """Every thread of this process back at normal priority."""
    for tid in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(tid)) == os.SCHED_IDLE:
                os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
        except OSError:  # a thread that ended meanwhile
            pass

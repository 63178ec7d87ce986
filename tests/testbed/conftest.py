"""Fixtures for the emulated-testbed tests: unique prefixes, private state dirs, crash cleanup.

Tests that need root and network namespaces are marked `netns`; they skip, with the reason,
where the machine cannot run them (not root, no `ip netns`). Every testbed here has its own
random prefix and lives under /run/lockstep-testbed-tests/<pytest pid>/b_<n>/, so `down --all`
in a test never touches another testbed (the demo's, another engineer's, another test's). A
session that was killed leaves its pid's directory behind; the next session tears those down.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from pathlib import Path

import pytest

from testbed import Fabric, generate, netns_problem, procs
from testbed.testing import unique_prefix

PROBLEM = netns_problem()
TESTS_ROOT = Path("/run/lockstep-testbed-tests")
SESSION_BASE = TESTS_ROOT / str(os.getpid())
_counter = itertools.count()


def pytest_collection_modifyitems(config, items):
    if PROBLEM is None:
        return
    skip = pytest.mark.skip(reason=f"needs root and network namespaces: {PROBLEM}")
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(skip)


def _teardown_session_dir(session_dir: Path) -> None:
    for base in sorted(p for p in session_dir.iterdir() if p.is_dir()):
        with contextlib.suppress(Exception):
            Fabric.down_all(base)
    shutil.rmtree(session_dir, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _testbed_session():
    if PROBLEM is not None:
        yield
        return
    if TESTS_ROOT.is_dir():  # testbeds of earlier sessions that were killed
        for stale in TESTS_ROOT.iterdir():
            if stale.name.isdigit() and procs.start_time(int(stale.name)) is None:
                _teardown_session_dir(stale)
    SESSION_BASE.mkdir(parents=True, exist_ok=True)
    yield
    _teardown_session_dir(SESSION_BASE)


def new_base_dir() -> Path:
    """A fresh state directory of this session (b_<n>: never mistaken for a prefix)."""
    path = SESSION_BASE / f"b_{next(_counter)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def prefix():
    return unique_prefix()


@pytest.fixture
def base_dir():
    return new_base_dir()


@pytest.fixture
def another_base_dir():
    return new_base_dir()


@pytest.fixture(scope="module")
def small_fabric():
    """4 hosts x 2 rails, 2 hosts per leaf (4 leaves), 2 spines: 10 namespaces, 16 links."""
    if PROBLEM is not None:
        pytest.skip(f"needs root and network namespaces: {PROBLEM}")
    fab = Fabric.up(generate(hosts=4, rails=2, hosts_per_leaf=2, spines=2), prefix=unique_prefix(),
                    base_dir=new_base_dir())
    yield fab
    fab.down()

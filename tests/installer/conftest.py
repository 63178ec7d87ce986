"""Fixtures for the installer tests.

- ``agent_package``: the package the console serves, built once per session; the first run on
  a machine downloads the pinned dependency wheels (``pip download``, from PyPI or the
  configured mirror) into ``var/agentdist/wheels``, as a console's set-up does.
- ``node_ns``: a fresh network namespace for the node, with a veth pair to the root namespace
  (needs root; tests that use it are marked ``netns`` and skip with the reason otherwise).
- ``ns_console``: the console under uvicorn on the test database (PostgreSQL and Redis when
  ``DATABASE_URL``/``REDIS_URL`` are set), listening on the root end of that veth pair.
- ``install_root``: an empty directory the installer installs under (``--root``), so the tests
  never touch this machine's /opt, /etc, /var or /run.
"""

from __future__ import annotations

import os
import shutil

import pytest

from console.agentdist.build import Layout, PackageUnavailable, current_packages, download_wheels
from testbed import netns_problem
from tests.conftest import World
from tests.installer.installer_lib import PREFIX, Console, NodeNamespace, TamperProxy, node_target
from tests.integration.conftest import free_port

NETNS_PROBLEM = netns_problem()
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs the installer for real (as root, under --root): "
                                "needs root")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        if "netns" in item.keywords and NETNS_PROBLEM is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs root and network namespaces: {NETNS_PROBLEM}"))


@pytest.fixture(scope="session")
def agent_package():
    layout = Layout.default()
    try:
        return current_packages(layout)[0]
    except PackageUnavailable:
        pass
    try:
        download_wheels(layout)
        return current_packages(layout)[0]
    except PackageUnavailable as exc:
        pytest.fail(f"the agent package cannot be built, so the installer cannot be tested: {exc}")


@pytest.fixture(scope="session")
def node_package(agent_package):
    """The package the installer downloads on this machine: its clock-sync variant, or the base."""
    target = node_target()
    return next((p for p in current_packages(Layout.default())[1:] if p.target == target), agent_package)


@pytest.fixture
def world(transactional_db, django_user_model):
    return World(django_user_model)


@pytest.fixture
def node_ns():
    ns = NodeNamespace()
    try:
        yield ns
    finally:
        ns.delete()


@pytest.fixture
def ns_console(transactional_db, node_ns, agent_package, tmp_path):
    console = Console(node_ns.host_ip, free_port(), tmp_path).start()
    try:
        yield console
    finally:
        console.stop()


@pytest.fixture
def loopback_console(transactional_db, agent_package, tmp_path):
    console = Console("127.0.0.1", free_port(), tmp_path).start()
    try:
        yield console
    finally:
        console.stop()


@pytest.fixture
def install_root(tmp_path_factory):
    root = tmp_path_factory.mktemp(f"{PREFIX}-root")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tamper_proxy(ns_console, node_ns):
    proxy = TamperProxy(node_ns.host_ip, ns_console.url)
    try:
        yield proxy
    finally:
        proxy.close()

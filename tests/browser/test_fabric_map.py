"""(draft) screenshots of the fabric map."""
from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from console.fleet.models import Cluster
from console.fleet.topology_io import import_topology
from testbed.topogen import generate
from tests.browser.conftest import needs_chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]


@pytest.mark.parametrize(("hosts", "rails", "per_leaf"), [(8, 2, 4), (128, 8, 16)])
def test_shot(page, live_console, world, sign_in, hosts, rails, per_leaf):
    cluster = Cluster.objects.create(organization=world.acme, name=f"c{hosts}")
    import_topology(cluster, generate(hosts=hosts, rails=rails, hosts_per_leaf=per_leaf, spines=2))
    sign_in("bob")
    page.get(f"{live_console}/clusters/{cluster.pk}/")
    page.find_element(By.ID, "fabric-map")
    page.save_screenshot(f"/tmp/shots/before-{hosts}x{rails}.png")

"""Incidents in a real browser: windows posted through the agent endpoint of the live console
open an incident, which appears on the open cluster page without a reload, with the culprit
recolored on the map; its page shows the affected pairs as a heat map and the timeline."""

from __future__ import annotations

import pytest
import requests
from selenium.webdriver.common.by import By

from tests.browser.conftest import needs_chromium
from tests.browser.test_console import mark_page, same_page, wait, wait_for_indicator
from tests.conftest import REDIS
from tests.console.incidents_testlib import T0_NS, WINDOW_S, make_sim_cluster, records_by_host
from tests.integration.conftest import celery_worker_process  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]


@pytest.fixture
def worker(request):
    """Where Redis is configured, triangulation runs in a Celery worker (in the console otherwise)."""
    return request.getfixturevalue("celery_worker_process") if REDIS else None


def post_window(base, sim, observations, index):
    start_ns = T0_NS + index * int(WINDOW_S * 1e9)
    for host, records in sorted(records_by_host(sim.topology, observations, start_ns).items()):
        sim.seqs[host] = sim.seqs.get(host, 0) + 1
        response = requests.post(f"{base}/api/v1/agent/telemetry", timeout=30,
                                 headers={"Authorization": f"Bearer {sim.credentials[host]}"},
                                 json={"seq": sim.seqs[host], "records": [
                                     {"kind": "probe.window", "ts": start_ns / 1e9 + WINDOW_S, "data": r}
                                     for r in records]})
        assert response.status_code == 202, response.text


def test_an_incident_appears_on_the_cluster_page_live_and_its_page_shows_the_heat_map(
        page, live_console, world, sign_in, worker):
    sim = make_sim_cluster(world.acme)
    faulty, truth = sim.window("link_loss:1", seed=3)
    culprit = truth["culprits"][0]
    sign_in("bob")
    page.get(f"{live_console}/clusters/{sim.cluster.pk}/")
    wait_for_indicator(page, "live")
    assert page.find_element(By.ID, "incidents").text == "No open incidents."
    mark_page(page)

    for i in range(2):
        post_window(live_console, sim, faulty, i)
    item = wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, "#incidents li[data-incident]"),
                "the incident never appeared on the cluster page", timeout=60)[0]
    assert item.text.startswith(f"{culprit['kind']} {culprit['name']}") and "open" in item.text
    kind = "link" if culprit["kind"] == "link" else "nic"
    wait(page, lambda p: any(f"health-{h}" in p.find_element(
        By.CSS_SELECTOR, f'#fabric-map [data-kind="{kind}"][data-name="{culprit["name"]}"]').get_attribute("class")
        for h in ("degraded", "down")), f"{culprit['name']} was never recolored")
    assert same_page(page)

    item.find_element(By.TAG_NAME, "a").click()
    wait(page, lambda p: p.find_elements(By.ID, "heatmap"), "the incident page has no heat map")
    cells = page.find_elements(By.CSS_SELECTOR, "#heatmap rect.cell")
    assert cells and max(float(c.get_attribute("data-loss")) for c in cells) > 0
    assert "opened" in page.find_element(By.ID, "incident-events").text
    assert page.find_element(By.TAG_NAME, "h1").text.endswith(culprit["name"])

"""The audit pages in a real browser: an operator starts an audit from the cluster's audit list, the
audit page follows its progress without a reload (by polling here: the socket is refused, so this
works whether or not the test's own changes reach the server's channel layer) and, when the node's
agent has answered, names the failing GPU's host and why; the PDF report downloads."""

from __future__ import annotations

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from agent.audit.results import bad, report
from console.audits.tasks import advance_audits
from tests.browser.conftest import SOCKET_TAP, needs_chromium
from tests.browser.test_console import mark_page, same_page, wait, wait_for_indicator
from tests.factories import make_fleet

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]


def test_an_operator_starts_an_audit_and_its_page_follows_it_to_the_culprit(page, live_console, world, sign_in):
    fleet = make_fleet(world.acme)
    agent = {"Authorization": f"Bearer {fleet.credential}"}
    beat = requests.post(f"{live_console}/api/v1/agent/heartbeat", json={"agent_version": "0.1.0"}, headers=agent,
                         timeout=10)
    assert beat.json()["node_state"] == "ready"
    sign_in("carol")
    page.inject(SOCKET_TAP % "true")
    page.get(f"{live_console}/clusters/{fleet.cluster.pk}/audits/")
    assert page.find_element(By.CSS_SELECTOR, f'#audits tr[data-audit="{fleet.audit.pk}"]').get_attribute(
        "data-verdict") == "warn"  # the factory's audit, of a node still enrolling then
    page.find_element(By.CSS_SELECTOR, "#start-audit button").click()
    wait(page, EC.presence_of_element_located((By.ID, "audit-progress")), "no audit page with its progress")
    # two nodes: the enrolled one, pending, and the topology's other host, never enrolled, not audited
    assert "Node checks — 1 of 2 nodes checked" in page.find_element(By.ID, "audit-progress").text
    wait_for_indicator(page, "polling")
    mark_page(page)

    commands = requests.get(f"{live_console}/api/v1/agent/commands?wait=0", headers=agent, timeout=10).json()
    [command] = [c for c in commands["commands"] if c["type"] == "audit.node"]
    result = report("node", [bad("gpu.row_remap", {"kind": "gpu", "name": "GPU 2", "index": 2}, "fail",
                                 "DCGM_FR_PENDING_ROW_REMAP", "reset", "GPU 2 has a pending row remap.",
                                 "Reset the GPU.", {"pending": 1}, {"pending": 0})],
                    hardware="h100-sxm", facts={}, errors=[])
    posted = requests.post(f"{live_console}/api/v1/agent/commands/{command['id']}/result", headers=agent, timeout=10,
                           json={"status": "succeeded", "result": result, "error": ""})
    assert posted.json() == {"accepted": True}
    advance_audits()  # the beat's step (no beat runs beside this test's server)

    wait(page, lambda p: p.find_element(By.ID, "audit-verdict").get_attribute("data-verdict") == "fail",
         "the page never showed the verdict")
    culprit = page.find_element(By.CSS_SELECTOR, f'#audit-culprits li[data-name="{fleet.node.name}"]')
    assert "DCGM_FR_PENDING_ROW_REMAP" in culprit.text and "GPU 2 has a pending row remap." in culprit.text
    row = page.find_element(By.CSS_SELECTOR, f'#audit-findings tr[data-element="{fleet.node.name}"]')
    assert "pending=1" in row.text and "pending=0" in row.text  # the evidence and the threshold
    assert same_page(page)

    href = page.find_element(By.ID, "audit-pdf").get_attribute("href")
    session = requests.Session()
    session.cookies.set("sessionid", page.get_cookie("sessionid")["value"])
    pdf = session.get(href, timeout=60)
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")

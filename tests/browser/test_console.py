"""The console in a real browser: headless Chromium against uvicorn, changes made through the
REST API and the agent protocol of that same server, seen on the page without a reload."""

from __future__ import annotations

import re

import pytest
import requests
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

from console.fleet.models import EnrollmentToken
from console.tenancy.models import Membership, Role
from tests.browser.conftest import SOCKET_TAP, needs_chromium
from tests.factories import make_fleet, small_topology

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

WAIT_S = 15  # polling runs every 5 s: this leaves room for two rounds on a busy machine


def wait(page, condition, message: str, timeout: float = WAIT_S):
    # A list page swaps its table when it refreshes: an element found a moment ago may be gone.
    return WebDriverWait(page, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition, message)


def css_class(page, selector: str) -> str:
    return page.find_element(By.CSS_SELECTOR, selector).get_attribute("class")


def wait_for_health(page, kind: str, name: str, health: str, timeout: float = WAIT_S) -> None:
    selector = f'#fabric-map [data-kind="{kind}"][data-name="{name}"]'
    wait(page, lambda p: f"health-{health}" in css_class(p, selector).split(),
         f"{kind} {name} never turned {health}", timeout)


def wait_for_indicator(page, state: str) -> None:
    wait(page, lambda p: p.find_element(By.ID, "live-status").get_attribute("data-state") == state,
         f"the live indicator never showed {state!r}")


def mark_page(page) -> None:
    """A flag that only survives as long as this very document: proof that nothing reloaded."""
    page.execute_script("window.__samePage = true")


def same_page(page) -> bool:
    return page.execute_script("return window.__samePage === true")


def api(base: str, world, name: str, method: str, path: str, **kwargs) -> requests.Response:
    headers = {"Authorization": f"Bearer {world.token(name)}"}
    return requests.request(method, f"{base}/api/v1/{path}", headers=headers, timeout=10, **kwargs)


# --- tests ----------------------------------------------------------------------------------------


def test_sign_in_switch_organization_and_open_a_cluster_map(page, live_console, world):
    make_fleet(world.acme, "acme-cluster")
    globex = make_fleet(world.globex, "globex-cluster")
    Membership.objects.create(organization=world.globex, user=world.users["bob"], role=Role.VIEWER)
    # The tests hash passwords with MD5 for speed; the server only knows its real hashers.
    world.users["bob"].password = PBKDF2PasswordHasher().encode("pw-bob", "browsersalt", iterations=1000)
    world.users["bob"].save(update_fields=["password"])

    page.get(f"{live_console}/clusters/")
    assert "/login/" in page.current_url  # the login form, not the page
    page.find_element(By.ID, "id_username").send_keys("bob")
    page.find_element(By.ID, "id_password").send_keys("pw-bob" + Keys.ENTER)
    wait(page, EC.text_to_be_present_in_element((By.TAG_NAME, "h1"), "Clusters of Acme"), "not signed in")
    assert "acme-cluster" in page.find_element(By.ID, "clusters").text

    Select(page.find_element(By.ID, "org-select")).select_by_visible_text("Globex")
    page.find_element(By.ID, "org-switch").click()
    wait(page, EC.text_to_be_present_in_element((By.TAG_NAME, "h1"), "Clusters of Globex"), "did not switch")
    table = page.find_element(By.ID, "clusters").text
    assert "globex-cluster" in table and "acme-cluster" not in table
    wait_for_indicator(page, "live")

    page.find_element(By.LINK_TEXT, "globex-cluster").click()
    wait(page, EC.presence_of_element_located((By.ID, "fabric-map")), "no map on the cluster page")
    assert len(page.find_elements(By.CSS_SELECTOR, '#fabric-map [data-kind="link"]')) == 3
    assert len(page.find_elements(By.CSS_SELECTOR, '#fabric-map [data-kind="switch"]')) == 2
    wait_for_indicator(page, "live")
    # The enrolled node's box: clicking it shows its details.
    page.find_element(By.CSS_SELECTOR, f'#fabric-map [data-kind="node"][data-name="{globex.node.name}"] rect').click()
    details = wait(page, EC.visibility_of_element_located((By.ID, "map-details")), "no details shown")
    assert globex.node.name in details.text and "enrolling" in details.text and "host" in details.text
    # Keyboard: a switch takes focus with Tab order and opens with Enter.
    switch = page.find_element(By.CSS_SELECTOR, '#fabric-map [data-kind="switch"][data-name="leaf-0"]')
    switch.send_keys(Keys.ENTER)
    wait(page, EC.text_to_be_present_in_element((By.ID, "details-title"), "leaf-0"), "Enter did not open details")


def test_an_api_change_recolors_the_node_live_without_reload(page, live_console, world, sign_in):
    fleet = make_fleet(world.acme)
    sign_in("bob")
    page.get(f"{live_console}/clusters/{fleet.cluster.pk}/")
    wait_for_indicator(page, "live")
    wait_for_health(page, "node", fleet.node.name, "unknown")
    mark_page(page)

    # The agent's first heartbeat: enrolling → ready (ok).
    beat = requests.post(f"{live_console}/api/v1/agent/heartbeat", json={"agent_version": "0.1.0"},
                         headers={"Authorization": f"Bearer {fleet.credential}"}, timeout=10)
    assert beat.json()["node_state"] == "ready"
    wait_for_health(page, "node", fleet.node.name, "ok")
    # An operator drains it through the REST API: ready → draining (degraded).
    assert api(live_console, world, "carol", "POST", f"nodes/{fleet.node.pk}/drain/").status_code == 200
    wait_for_health(page, "node", fleet.node.name, "degraded")
    row = page.find_element(By.CSS_SELECTOR, f'#nodes tr[data-name="{fleet.node.name}"] [data-field="state"]')
    assert row.text == "draining"
    assert same_page(page)
    assert int(page.execute_script("return document.body.dataset.liveEvents")) >= 2  # it came by websocket
    assert page.execute_script("return window.performance.getEntriesByType('navigation').length") == 1


def test_the_page_catches_up_by_polling_when_the_socket_is_gone(page, live_console, world, sign_in):
    fleet = make_fleet(world.acme)
    sign_in("bob")
    page.inject(SOCKET_TAP % "false")
    page.get(f"{live_console}/clusters/{fleet.cluster.pk}/")
    wait_for_indicator(page, "live")
    mark_page(page)

    # The socket dies and the server cannot be reached by websocket any more.
    page.execute_script("window.__blockSockets = true; window.__sockets.forEach(function (s) { s.close(); });")
    wait_for_indicator(page, "polling")
    # It tries to reconnect (after a 1 s backoff), and the attempt fails like a refused socket.
    wait(page, lambda p: p.execute_script(
        "var s = window.__sockets; return s.length >= 2 && s[1].url.endsWith('/blocked') && s[1].readyState === 3"),
        "no failed reconnection attempt")
    events_before = page.execute_script("return document.body.dataset.liveEvents || '0'")

    assert api(live_console, world, "carol", "POST", f"nodes/{fleet.node.pk}/drain/").status_code == 200
    wait_for_health(page, "node", fleet.node.name, "degraded")
    state = page.find_element(By.CSS_SELECTOR, f'#nodes tr[data-name="{fleet.node.name}"] [data-field="state"]')
    assert state.text == "draining"
    assert page.execute_script("return document.body.dataset.liveEvents || '0'") == events_before  # polled
    assert "polling every 5 s" in page.find_element(By.ID, "live-status").text
    assert same_page(page)
    assert page.find_element(By.ID, "live-status").get_attribute("data-state") == "polling"


def test_the_clusters_list_refreshes_on_topology_events(page, live_console, world, sign_in):
    sign_in("bob")
    page.get(f"{live_console}/clusters/")
    wait_for_indicator(page, "live")
    mark_page(page)
    created = api(live_console, world, "alice", "POST", "clusters/", json={"name": "fresh"})
    assert created.status_code == 201
    cluster_id = created.json()["id"]
    put = api(live_console, world, "alice", "PUT", f"clusters/{cluster_id}/topology/", json=small_topology("n"))
    assert put.status_code == 200, put.text
    row = f'#clusters tr[data-cluster="{cluster_id}"]'
    wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, row), "the new cluster never appeared")
    cells = page.find_element(By.CSS_SELECTOR, row).text
    assert "fresh" in cells and "n-fabric" in cells
    assert page.find_element(By.CSS_SELECTOR, f'{row} [data-count="enrolling"]').text == "2"
    # A node changing state moves the counts too.
    node = next(n for n in api(live_console, world, "alice", "GET", "nodes/", params={"cluster": cluster_id})
                .json()["results"] if n["name"] == "n0")
    assert api(live_console, world, "carol", "POST", f"nodes/{node['id']}/drain/").status_code == 200
    wait(page, lambda p: p.find_element(By.CSS_SELECTOR, f'{row} [data-count="draining"]').text == "1",
         "the draining count never moved")
    assert page.find_element(By.CSS_SELECTOR, f'{row} [data-count="enrolling"]').text == "1"
    assert same_page(page)


def test_an_operator_creates_an_enrollment_token_and_reads_the_install_command(page, live_console, world, sign_in):
    fleet = make_fleet(world.acme)
    sign_in("carol")
    page.get(f"{live_console}/clusters/{fleet.cluster.pk}/")
    page.find_element(By.ID, "token-description").send_keys("rack 7")
    uses = page.find_element(By.ID, "token-uses")
    uses.clear()  # it shows the default (a bounded number of uses)
    uses.send_keys("5" + Keys.ENTER)  # submitted from the keyboard
    command = wait(page, EC.visibility_of_element_located((By.ID, "install-command")), "no install command").text
    assert command == f"curl -fsSL {live_console}/install.sh | sudo sh"  # the token is never in the line
    match = re.fullmatch(r"lse_\S+", page.find_element(By.ID, "enrollment-token").text)
    assert match, page.find_element(By.ID, "enrollment-token").text
    token = EnrollmentToken.lookup(match.group(0))
    assert token is not None and token.description == "rack 7" and token.max_uses == 5
    listed = page.find_element(By.CSS_SELECTOR, f'#enrollment-tokens tr[data-token="{token.pk}"]').text
    assert token.prefix_display in listed and "0/5" in listed and "active" in listed
    # The token on the page is the real thing: an agent enrolls with it.
    enrolled = requests.post(f"{live_console}/api/v1/agent/enroll", timeout=10,
                             json={"token": match.group(0), "host": {"hostname": "newhost", "machine_id": "m-new"}})
    assert enrolled.status_code == 201, enrolled.text


def test_starting_clock_sync_updates_the_clock_panel_live(page, live_console, world, sign_in):
    fleet = make_fleet(world.acme)
    sign_in("bob")
    page.get(f"{live_console}/clusters/{fleet.cluster.pk}/")
    wait_for_indicator(page, "live")
    cell = f'#node-clocks tr[data-name="{fleet.node.name}"] [data-field="state"]'
    assert page.find_element(By.CSS_SELECTOR, cell).text == "unsynced"
    assert page.find_element(By.CSS_SELECTOR, '#clock-summary [data-field="nodes_total"]').text == "0"
    mark_page(page)
    beat = requests.post(f"{live_console}/api/v1/agent/heartbeat", json={"agent_version": "0.1.0"},
                         headers={"Authorization": f"Bearer {fleet.credential}"}, timeout=10)
    assert beat.json()["node_state"] == "ready"
    # An operator (re)starts clock sync: the ready node is planned, and as the only one it is the reference.
    started = api(live_console, world, "carol", "POST", "clock-syncs/", json={"cluster": fleet.cluster.pk})
    assert started.status_code == 201, started.text
    wait(page, lambda p: p.find_element(By.CSS_SELECTOR, cell).text == "reference", "the node's clock state")
    wait(page, lambda p: p.find_element(By.CSS_SELECTOR, '#clock-summary [data-field="nodes_total"]').text == "1",
         "the cluster's clock summary")
    assert "state-reference" in css_class(page, cell)
    assert same_page(page)

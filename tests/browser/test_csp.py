"""Issue 9, finding 10: the pages work under their Content-Security-Policy (no inline script or
style), seen by a real browser: it reports every violation as a `securitypolicyviolation` event."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser.conftest import needs_chromium
from tests.factories import make_fleet

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + e.sourceFile + ":" + e.lineNumber);
});
"""


def until(page, condition, message: str):
    return WebDriverWait(page, 20, poll_frequency=0.1).until(condition, message)


def test_the_pages_run_under_their_policy_without_a_violation(page, live_console, world, sign_in):
    fleet = make_fleet(world.acme)  # with a topology: the page draws its map
    page.inject(VIOLATIONS)
    sign_in("alice")

    page.get(f"{live_console}/clusters/{fleet.cluster.pk}/")
    fabric = page.find_element(By.ID, "fabric-map")
    # The map's size comes from its data attributes through the page's script (no style attribute).
    until(page, lambda p: fabric.value_of_css_property("min-width") not in ("", "0px", "auto"), "the map is unsized")
    until(page, lambda p: p.find_element(By.ID, "live-status").get_attribute("data-state") == "live",
          "the live socket never connected")
    assert page.execute_script("return window.__violations") == []

    page.get(f"{live_console}/api/v1/docs/")
    until(page, lambda p: p.find_elements(By.CSS_SELECTOR, "#swagger-ui .opblock"), "the API docs never rendered")
    assert page.execute_script("return window.__violations") == []

    page.delete_all_cookies()
    page.get(f"{live_console}/login/")
    assert page.find_element(By.ID, "id_username")
    assert page.execute_script("return window.__violations") == []

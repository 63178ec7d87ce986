"""Headless Chromium driven by Selenium against the console served by a real uvicorn process.

One browser per module (each start costs seconds); every test gets a clean cookie jar. Tests are
skipped, with the reason, only when Chromium or its driver is not installed (Debian packages
`chromium` and `chromium-driver`). The browser runs without network access of its own: every
background service that would phone home is switched off.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import World
from tests.integration.conftest import live_console  # noqa: F401  (the fixture)

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(tempfile.gettempdir()) / "lockstep-browser-artifacts"

_missing = " and ".join(n for n, p in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not p)
needs_chromium = pytest.mark.skipif(
    bool(_missing), reason=f"{_missing} not installed (apt-get install chromium chromium-driver)"
)

# Installed before any page script runs: keeps every websocket the page opens in
# window.__sockets, and while window.__blockSockets is true points new ones at a closed port, so
# they fail the way a socket fails when the server or a proxy refuses it.
SOCKET_TAP = """
(function () {
  var Native = window.WebSocket;
  window.__sockets = [];
  window.__blockSockets = %s;
  function Tapped(url, protocols) {
    var socket = new Native(window.__blockSockets ? "ws://127.0.0.1:9/blocked" : url, protocols);
    window.__sockets.push(socket);
    return socket;
  }
  Tapped.prototype = Native.prototype;
  ["CONNECTING", "OPEN", "CLOSING", "CLOSED"].forEach(function (k) { Tapped[k] = Native[k]; });
  window.WebSocket = Tapped;
})();
"""


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="lockstep-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser, request):
    """The module's browser with no cookies and no injected scripts; a screenshot on failure."""
    browser.delete_all_cookies()
    injected: list[str] = []
    browser.inject = lambda source: injected.append(
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})["identifier"]
    )
    yield browser
    for identifier in injected:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": identifier})
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{request.node.name}.png"
        browser.save_screenshot(str(path))
        print(f"screenshot of the failure: {path}")
    browser.get("about:blank")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.rep_call = report
    return report


@pytest.fixture
def world(transactional_db, django_user_model):
    return World(django_user_model)


@pytest.fixture
def sign_in(page, live_console, world):  # noqa: F811
    """Sign a person in without the form (the form has its own test): their session cookie."""

    def sign_in(name: str) -> None:
        client = Client()
        client.force_login(world.users[name])
        page.get(f"{live_console}/healthz")  # a page of the console's origin, to set its cookie on
        page.add_cookie({"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"})

    return sign_in

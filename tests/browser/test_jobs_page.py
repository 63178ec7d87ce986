"""The jobs pages in a real browser (headless Chromium against uvicorn): events an agent posts
(a job's heartbeat, its snapshot, a weight version, an NCCL failover) show up on the open pages
without a reload, over the live websocket."""

from __future__ import annotations

import pytest
import requests
from selenium.webdriver.common.by import By

from tests.browser.conftest import needs_chromium
from tests.browser.test_console import mark_page, same_page, wait, wait_for_indicator
from tests.factories import make_fleet

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

TS = 1796403600.0


def post_events(base, fleet, seq, *events):
    records = [{"kind": f"event.{kind}", "ts": TS + i, "data": data} for i, (kind, data) in enumerate(events)]
    response = requests.post(f"{base}/api/v1/agent/telemetry", json={"seq": seq, "records": records},
                             headers={"Authorization": f"Bearer {fleet.credential}"}, timeout=10)
    assert response.status_code == 202, response.text


def test_the_jobs_pages_follow_the_agents_events_live(page, live_console, world, sign_in):
    fleet = make_fleet(world.acme)
    sign_in("bob")
    page.get(f"{live_console}/clusters/{fleet.cluster.pk}/jobs/")
    wait_for_indicator(page, "live")
    mark_page(page)
    post_events(live_console, fleet, 50,
                ("job.heartbeat", {"job": "train-9", "generation": 0,
                                   "ranks": [{"rank": r, "step": 17, "step_time_s": 0.02, "node": 0, "state": "running"}
                                             for r in range(4)]}),
                ("nccl.failover", {"comm": "0x7f3a", "rank": 2, "from": "mlx5_0", "to": "mlx5_1"}))
    row = '#jobs tr[data-name="train-9"]'
    wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, row), "the job never appeared")
    assert page.find_element(By.CSS_SELECTOR, f'{row} [data-field="step"]').text == "17"
    wait(page, lambda p: "mlx5_1" in p.find_element(By.ID, "path-events").text, "the failover never appeared")
    assert same_page(page)

    page.find_element(By.CSS_SELECTOR, f"{row} a").click()
    wait(page, lambda p: p.find_elements(By.ID, "captures"), "no job page")
    wait_for_indicator(page, "live")
    mark_page(page)
    post_events(live_console, fleet, 51,
                ("job.snapshot", {"job": "train-9", "id": "20261201T120000-beef01", "step": 20, "bytes": 4096,
                                  "paused_s": 0.01, "duration_s": 0.5, "path": "/snapshots/train-9/20261201T120000-beef01",
                                  "reason": "on demand", "undiscovered": [], "ranks": 4}),
                ("weights.version", {"job": "train-9", "publisher": "p" * 32, "version": 4, "bytes": 1 << 20,
                                     "duration_s": 0.1, "replicas": {"r0": "ok"},
                                     "holders": {"r0": {"received": 4, "applied": 4, "sending": None}}}))
    wait(page, lambda p: "20261201T120000-beef01" in p.find_element(By.ID, "captures").text,
         "the snapshot never appeared")
    wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, '#weight-versions tr[data-version="4"]'),
         "the weight version never appeared")
    assert "r0: v4" in page.find_element(By.ID, "weight-versions").text
    assert same_page(page)
    assert int(page.execute_script("return document.body.dataset.liveEvents")) >= 1  # it came by websocket

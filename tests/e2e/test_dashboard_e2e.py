"""The live dashboard in headless Chromium against a loaded gateway: charts draw, numbers move."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.gateway import build_gateway
from tests.e2e.browser import Browser
from tests.e2e.servers import serving
from tests.e2e.test_drain_e2e import Slow

pytestmark = pytest.mark.e2e

#: Set to a path (e.g. docs/img/dashboard.png) to keep the screenshot.
SHOT_ENV = "BALLAST_DASHBOARD_SCREENSHOT"


def _load(base: str, stop: threading.Event) -> None:
    """Closed-loop load from 12 clients until ``stop`` (bounded: 1,500 requests each)."""

    def client() -> None:
        with httpx.Client(timeout=10) as c:
            for i in range(1500):
                if stop.is_set():
                    return
                prio = ("critical", "standard", "bulk")[i % 3]
                c.get(f"{base}/work?ms=40", headers={"X-Priority": prio})

    with ThreadPoolExecutor(max_workers=12) as pool:
        for _ in range(12):
            pool.submit(client)


def test_dashboard_renders_live_data_offline(tmp_path: Path) -> None:
    """Charts draw, the numbers move under load, no console errors, nothing fetched elsewhere."""
    app = Slow()
    with serving(app, lifespan="off") as up:
        config = build_config({"upstream": f"http://127.0.0.1:{up}",
                               "max_concurrent_requests": 3,
                               "admission_queue": {"max_queue_size": 4}})  # fmt: skip
        with serving(build_gateway(config, env={})) as port:
            base = f"http://127.0.0.1:{port}"
            stop = threading.Event()
            loader = threading.Thread(target=_load, args=(base, stop), daemon=True)
            loader.start()
            try:
                with Browser(tmp_path / "profile") as browser:
                    browser.call("Page.navigate", url=f"{base}/_ballast/dashboard")
                    browser.pump(20.0 if os.environ.get(SHOT_ENV) else 6.0)
                    state = browser.evaluate("""({
                      samples: Number(document.body.dataset.samples || 0),
                      limit: document.getElementById('v-limit').textContent,
                      inflight: Math.max(...series.limit['in flight']),
                      shedMax: Math.max(0, ...Object.values(series.tier).flat()),
                      points: [...document.querySelectorAll('canvas')]
                                .map(c => Number(c.dataset.points || 0)),
                      status: document.getElementById('status').textContent,
                    })""")
                    browser.screenshot(tmp_path / "dashboard.png")
                    if os.environ.get(SHOT_ENV):
                        browser.screenshot(Path(os.environ[SHOT_ENV]))
                    errors, requested = browser.errors, browser.requested
            finally:
                stop.set()
                loader.join(30)
    assert errors == []
    assert requested and all(u.startswith(base + "/") for u in requested), requested
    assert state["samples"] >= 3 and state["status"].startswith("live")
    assert state["limit"] == "3" and state["inflight"] > 0 and state["shedMax"] > 0
    assert all(p > 0 for p in state["points"])
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000

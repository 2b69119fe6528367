"""The live dashboard in headless Chromium against a loaded gateway: charts draw, numbers move."""

from __future__ import annotations

import json
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


async def _status_app(scope: dict[str, object], receive: object, send: object) -> None:
    """``/status/N`` answers N, the rest 200."""
    if scope["type"] != "http":
        return
    path = str(scope["path"])
    status = int(path.split("/")[2]) if path.startswith("/status/") else 200
    await send({"type": "http.response.start", "status": status, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"x"})  # type: ignore[operator]


def test_dashboard_lists_routes_with_their_breaker_state(tmp_path: Path) -> None:
    """An open route breaker is listed first, as open; a healthy route next to it, closed."""
    with serving(_status_app, lifespan="off") as up:
        config = build_config({"upstream": f"http://127.0.0.1:{up}",
                               "breaker": {"consecutive_failures": 2, "min_failing_clients": 1,
                                           "open_ms": 60_000, "max_open_ms": 60_000},
                               "retry": {"enabled": False}})  # fmt: skip
        with serving(build_gateway(config, env={})) as port:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=10) as c:
                # the first goes to "other" (its 500 gives /status a route), two open /status
                assert [c.get("/status/500").status_code for _ in range(4)] == [500] * 3 + [503]
                assert [c.get("/get").status_code for _ in range(2)] == [200, 200]
            with Browser(tmp_path / "profile") as browser:
                browser.call("Page.navigate", url=f"{base}/_ballast/dashboard")
                browser.pump(3.0)
                rows = browser.evaluate("""[...document.querySelectorAll('#routes tr[data-route]')]
                    .map(r => [r.dataset.route, r.dataset.state])""")
                errors = browser.errors
    assert errors == []
    assert rows[0] == ["/status", "open"]
    assert ["/get", "closed"] in rows


def test_the_policy_runs_the_page_script_and_nothing_injected(tmp_path: Path) -> None:
    """The CSP allows the page's own script (by hash) and no injected script or handler;
    a hostile series name is drawn as text, never markup."""
    with serving(Slow(), lifespan="off") as up:
        config = build_config({"upstream": f"http://127.0.0.1:{up}"})
        with serving(build_gateway(config, env={})) as port:
            base = f"http://127.0.0.1:{port}"
            policy = httpx.get(f"{base}/_ballast/dashboard").headers["content-security-policy"]
            with Browser(tmp_path / "profile") as browser:
                browser.call("Page.navigate", url=f"{base}/_ballast/dashboard")
                browser.pump(2.5)
                clean = list(browser.errors)
                browser.evaluate("""(() => {
                  const s = document.createElement('script');
                  s.textContent = 'window.pwned = 1'; document.head.appendChild(s);
                  const img = document.createElement('img');
                  img.setAttribute('onerror', 'window.pwned = 2'); img.src = 'x:';
                  document.body.appendChild(img);
                  push('shed', '<img src=x: onerror="window.pwned=3">', 1); draw('shed');
                })()""")
                browser.pump(1.0)
                state = browser.evaluate("""({
                  samples: Number(document.body.dataset.samples || 0),
                  pwned: window.pwned === undefined ? 0 : window.pwned,
                  legend: document.getElementById('l-shed').textContent,
                  legendImgs: document.querySelectorAll('#l-shed img').length,
                  badge: document.querySelector('#breaker-state .badge').textContent,
                })""")
                blocked = browser.errors[len(clean) :]
    assert "'unsafe-inline'" not in policy and "script-src 'sha256-" in policy
    assert clean == [] and state["samples"] >= 1  # the page's own script ran, no violation
    assert state["pwned"] == 0 and state["legendImgs"] == 0
    assert '<img src=x: onerror="window.pwned=3">' in state["legend"]
    assert state["badge"] == "closed"
    assert any("Content Security Policy" in e for e in blocked), blocked


def test_every_breaker_is_shown_with_its_own_state(tmp_path: Path) -> None:
    """A pool with a route breaker open: the page shows that route, each instance and the
    header as open (not the default breaker's closed), and readable panels, no JSON dump."""
    with serving(_status_app, lifespan="off") as a, serving(_status_app, lifespan="off") as b:
        config = build_config({"upstream": [f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"],
                               "breaker": {"consecutive_failures": 2, "min_failing_clients": 1,
                                           "open_ms": 60_000, "max_open_ms": 60_000},
                               "upstreams": {"health_check": {"enabled": False}},
                               "retry": {"enabled": False}})  # fmt: skip
        with serving(build_gateway(config, env={})) as port:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=10) as c:
                codes = [c.get("/status/500").status_code for _ in range(8)]
                snap = c.get("/_ballast/snapshot").json()
            with Browser(tmp_path / "profile") as browser:
                browser.call("Page.navigate", url=f"{base}/_ballast/dashboard")
                browser.pump(3.0)
                state = browser.evaluate("""({
                  rows: [...document.querySelectorAll('#breakers tr[data-kind]')]
                          .map(r => [r.dataset.kind, r.dataset.name, r.dataset.state]),
                  header: document.getElementById('v-breaker').textContent,
                  badge: document.querySelector('#breaker-state .badge').textContent,
                  instances: [...document.querySelectorAll('#upstreams tr[data-url]')]
                               .map(r => [r.dataset.url, r.dataset.breaker]),
                  panels: Object.fromEntries([...document.querySelectorAll('table.kv')]
                            .map(t => [t.id, [...t.querySelectorAll('tr')]
                              .map(r => r.dataset.key)])),
                  dump: document.querySelectorAll('pre').length,
                })""")
                hostile = browser.evaluate("""(() => {   // names are data: drawn as text
                  const x = '<img src=x: onerror="window.pwned=1">';
                  drawPanels({routes: {[x]: {breaker: {state: 'open'}}}, degraded: [x],
                    upstreams: [{url: x, breaker: x, healthy: true}], canary: {state: x},
                    client: {[x]: x}, websocket: null}, x);
                  return {imgs: document.querySelectorAll('main img').length,
                          text: document.getElementById('breakers').textContent,
                          warnings: document.getElementById('warnings').textContent};
                })()""")
                browser.pump(0.5)
                pwned = browser.evaluate("window.pwned === undefined ? 0 : window.pwned")
                browser.evaluate(f"window.snapForTest = {json.dumps(snap)}; 0")
                merged = browser.evaluate("""(() => {   // ballast --workers 2, one missing
                  const one = window.snapForTest, two = JSON.parse(JSON.stringify(one));
                  two.upstreams.forEach(u => { u.breaker = 'closed'; });
                  drawPanels(merge({workers: [two, one],
                    missing: [{index: 2, state: 'restarting'}]}), 'open');
                  return {rows: [...document.querySelectorAll('#upstreams tr[data-url]')]
                                  .map(r => r.dataset.breaker),
                          warnings: document.getElementById('warnings').textContent,
                          worker: document.querySelector('#p-process td').textContent};
                })()""")
                errors = browser.errors
    assert snap["routes"]["/status"]["breaker"]["state"] == "open", (codes, snap["routes"])
    assert snap["breaker"]["state"] == "closed"  # the top-level state the page used to show
    assert errors == []
    assert ["route", "/status", "open"] in state["rows"]
    assert state["rows"][0][2] == "open" and state["header"] == "open" == state["badge"]
    assert any(kind == "default" and st == "closed" for kind, _, st in state["rows"])
    shown = {u: s for u, s in state["instances"]}
    assert shown == {u["url"]: u["breaker"] for u in snap["upstreams"]} and len(shown) == 2
    for u in snap["upstreams"]:
        assert ["instance", u["url"], u["breaker"]] in state["rows"]
    assert "open connections" in state["panels"]["p-websocket"]
    assert "balance (retries available)" in state["panels"]["p-retry_budget"]
    assert state["panels"]["p-canary"] == ["state"] and state["dump"] == 0
    assert hostile["imgs"] == 0 and pwned == 0
    assert '<img src=x: onerror="window.pwned=1">' in hostile["text"]
    assert '<img src=x: onerror="window.pwned=1">' in hostile["warnings"]
    assert merged["rows"] == [u["breaker"] for u in snap["upstreams"]]  # the worst view wins
    assert "worker 2 missing (restarting)" in merged["warnings"]
    assert merged["worker"] == "2 live of 3"

"""`ballast --workers 2`: the cap is divided, /metrics counts both workers, SIGTERM drains both."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.server.workers import merge_metrics, scale_config
from tests.e2e.raw import metric
from tests.e2e.support import (
    HANG_S,
    NO_BALLAST_ENV,
    free_port,
    serve_in_thread,
    stop_thread,
    wait_http,
)
from tests.e2e.test_trust_e2e import Recorder

pytestmark = pytest.mark.e2e


def test_scale_config_divides_every_cap() -> None:
    """Each of 3 workers gets ceil(cap / 3); an adaptive limiter keeps min <= initial <= max."""
    config = build_config({"upstream": "http://u", "max_concurrent_requests": 10,
                           "limiter": {"algorithm": "gradient"}})  # fmt: skip
    one = scale_config(config, 3)
    assert one.max_concurrent_requests == 4 and one.limiter.max_limit == 334
    assert one.capacity.max_held_requests == 1366 and one.websocket.max_connections == 334
    assert one.limiter.min_limit <= one.limiter.initial_limit <= one.limiter.max_limit
    assert scale_config(config, 1) is config


def test_merge_metrics_sums_counters_and_takes_max_of_latency_gauges() -> None:
    """Counters and additive gauges add up; *_seconds gauges take the maximum."""
    a = (
        '# TYPE ballast_requests counter\nballast_requests_total{priority="bulk"} 2.0\n'
        "# TYPE ballast_inflight_requests gauge\nballast_inflight_requests 3.0\n"
        "# TYPE ballast_limiter_rtt_min_seconds gauge\nballast_limiter_rtt_min_seconds 0.02\n"
    )
    b = a.replace("2.0", "5.0").replace("3.0", "1.0").replace("0.02", "0.05")
    merged = merge_metrics([a, b])
    assert metric(merged, "ballast_requests_total", priority="bulk") == 7
    assert metric(merged, "ballast_inflight_requests") == 4
    assert metric(merged, "ballast_limiter_rtt_min_seconds") == 0.05


def test_two_workers_split_the_cap_and_report_together(tmp_path: Path) -> None:
    """Limit 10 over 2 workers is 5 each (not 10 each); /metrics counts every request once."""
    rec, up_port = Recorder(), free_port()
    server, thread = serve_in_thread(rec, up_port)
    port, admin = free_port(), free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\nmax_concurrent_requests: 10\n"
                      "server: {drain_grace_ms: 0}\n")  # fmt: skip
    args = [sys.executable, "-m", "ballast_asgi", "--config", str(config), "--port",
            str(port), "--admin-port", str(admin), "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{admin}/health", proc)
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        for _ in range(20):
            with httpx.Client() as client:  # a new connection each time
                assert client.get(f"http://127.0.0.1:{port}/x").status_code == 200
        snap = httpx.get(f"http://127.0.0.1:{admin}/snapshot").json()
        text = httpx.get(f"http://127.0.0.1:{admin}/metrics").text
        one = httpx.get(f"http://127.0.0.1:{port}/_ballast/snapshot").json()
        proc.terminate()
        code = proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=HANG_S)  # the workers die with the supervisor (PDEATHSIG)
        stop_thread(server, thread)
    workers = snap["workers"]
    assert sorted(w["worker"]["index"] for w in workers) == [0, 1]
    assert [w["limiter"]["limit"] for w in workers] == [5, 5]
    assert one["worker"]["of"] == 2 and one["limiter"]["limit"] == 5
    assert metric(text, "ballast_concurrency_limit") == 10
    assert metric(text, "ballast_requests_total", priority="standard") == 20
    assert len(rec.seen) == 20 and code == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, os.WNOHANG)[0] == 0  # not our child: still there
    return True


def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    """``kill -9`` of the supervisor does not leave its workers serving on their own."""
    rec, up_port = Recorder(), free_port()
    server, thread = serve_in_thread(rec, up_port)
    port, admin = free_port(), free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\nserver: {{drain_grace_ms: 0}}\n")
    args = [sys.executable, "-m", "ballast_asgi", "--config", str(config), "--port",
            str(port), "--admin-port", str(admin), "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    workers: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        workers = [w["worker"]["pid"] for w in
                   httpx.get(f"http://127.0.0.1:{admin}/snapshot").json()["workers"]]  # fmt: skip
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        proc.kill()
        proc.wait(timeout=HANG_S)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for an outside process's exit, bounded
        assert not any(_alive(pid) for pid in workers)
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=HANG_S)
        stop_thread(server, thread)


def test_a_killed_worker_is_restarted_and_metrics_answer_throughout(tmp_path: Path) -> None:
    """``kill -9`` of a worker: logged, restarted within 5 s; admin /metrics 200 all along."""
    rec, up_port = Recorder(), free_port()
    server, thread = serve_in_thread(rec, up_port)
    port, admin = free_port(), free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\nserver: {{drain_grace_ms: 0}}\n")
    log = tmp_path / "stderr.log"
    args = [sys.executable, "-m", "ballast_asgi", "--config", str(config), "--port",
            str(port), "--admin-port", str(admin), "--workers", "2"]  # fmt: skip
    with log.open("wb") as err:
        proc = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=err)
    statuses: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        snap = httpx.get(f"http://127.0.0.1:{admin}/snapshot").json()
        before = {w["worker"]["index"]: w["worker"]["pid"] for w in snap["workers"]}
        os.kill(before[1], signal.SIGKILL)
        killed = time.monotonic()
        restarted_s = None
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() - killed < 8.0:
                statuses.append(client.get(f"http://127.0.0.1:{admin}/metrics").status_code)
                snap = client.get(f"http://127.0.0.1:{admin}/snapshot").json()
                now = {w["worker"]["index"]: w["worker"]["pid"] for w in snap["workers"]}
                if restarted_s is None and now.get(1) not in (None, before[1]):
                    restarted_s = time.monotonic() - killed
                    text = client.get(f"http://127.0.0.1:{admin}/metrics").text
                    health = client.get(f"http://127.0.0.1:{admin}/health").json()
                    break
                time.sleep(0.05)  # polling an outside process, bounded
        assert httpx.get(f"http://127.0.0.1:{port}/x").status_code == 200
        proc.terminate()
        code = proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=HANG_S)
        stop_thread(server, thread)
    lines = log.read_text()
    print(f"\nworker restarted {restarted_s} s after kill -9; /metrics statuses {set(statuses)}")
    assert restarted_s is not None and restarted_s < 5.0, lines
    assert set(statuses) == {200}, statuses
    assert metric(text, "ballast_worker_up", worker="1") == 1
    assert metric(text, "ballast_worker_restarts_total", worker="1") == 1
    assert health == {"status": "ok"}
    assert "worker.died" in lines and 'exit="signal SIGKILL"' in lines, lines
    assert "worker.restarted" in lines and code == 0, lines


def test_missing_worker_is_reported_not_refused() -> None:
    """A worker that does not answer: /metrics and /snapshot 200 from the others, say which."""
    from ballast_asgi.server.worker_admin import Aggregator, Slot

    gone = Slot(1, "/nonexistent/b.sock", pid=12, state="restarting", last_exit="signal SIGKILL")
    slots = [Slot(0, "/nonexistent/a.sock", pid=11, state="running"), gone]
    app = Aggregator(slots)

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://a") as client:
            return (await client.get("/metrics"), await client.get("/snapshot"),
                    await client.get("/health"))  # fmt: skip

    import asyncio

    metrics_r, snap_r, health_r = asyncio.run(go())
    assert metrics_r.status_code == 200 and snap_r.status_code == 200
    assert metric(metrics_r.text, "ballast_worker_up", worker="1") == 0
    assert snap_r.json()["missing"][1] == gone.describe()
    assert gone.describe()["state"] == "restarting"
    assert health_r.status_code == 503 and health_r.json()["status"] == "down"


def test_a_worker_that_keeps_crashing_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real forks: a worker exiting at once is restarted with back-off, then given up."""
    import asyncio
    import socket
    import tempfile

    from ballast_asgi.server import supervisor as sup_mod

    monkeypatch.setattr(sup_mod, "RESTART_BASE_S", 0.001)
    monkeypatch.setattr(sup_mod, "CRASH_LIMIT", 3)
    seen: list[str] = []
    monkeypatch.setattr(sup_mod, "emit", lambda event, *a, **kw: seen.append(event))
    tmp = tempfile.mkdtemp()
    with socket.socket() as traffic:
        sup = sup_mod.Supervisor(1, traffic, lambda i, t, a: os._exit(3), tmp)
        sup.fork(sup.slots[0])
        asyncio.run(asyncio.wait_for(sup_mod._parent(sup, None, {}), 30))
    os.unlink(sup.slots[0].path)
    os.rmdir(tmp)
    assert seen == ["worker.died", "worker.restarted"] * 3 + ["worker.crash_loop"], seen
    assert sup.slots[0].state == "given_up" and sup.exit_code() == 1


def test_sigterm_while_a_restart_is_pending_stops_the_supervisor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real fork: the only worker died, its restart waits; SIGTERM then ends the supervisor."""
    import asyncio
    import socket
    import tempfile

    from ballast_asgi.server import supervisor as sup_mod

    monkeypatch.setattr(sup_mod, "RESTART_BASE_S", 60.0)  # the restart never comes in time
    died = asyncio.Event()
    monkeypatch.setattr(sup_mod, "emit", lambda event, *a, **kw: died.set())
    tmp = tempfile.mkdtemp()
    with socket.socket() as traffic:
        sup = sup_mod.Supervisor(1, traffic, lambda i, t, a: os._exit(0), tmp)
        sup.fork(sup.slots[0])

        async def go() -> None:
            loop = asyncio.get_running_loop()
            parent = asyncio.ensure_future(sup_mod._parent(sup, None, {}))
            await died.wait()  # worker.died: the exit was reaped, the restart is pending
            assert sup.slots[0].state == "restarting"
            loop.call_soon(sup.forward, signal.SIGTERM)
            await parent

        asyncio.run(asyncio.wait_for(go(), 30))
    os.unlink(sup.slots[0].path)
    os.rmdir(tmp)
    assert sup.slots[0].state == "exited" and sup.exit_code() == 0


def test_a_given_up_worker_s_share_goes_to_the_live_one(tmp_path: Path) -> None:
    """workers.redivide_on_loss: worker 1 killed until given up; worker 0's limit 5 -> 10."""
    rec, up_port = Recorder(), free_port()
    server, thread = serve_in_thread(rec, up_port)
    port, admin = free_port(), free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\nmax_concurrent_requests: 10\n"
                      "limiter: {algorithm: fixed}\nserver: {drain_grace_ms: 0}\n"
                      "workers: {redivide_on_loss: true}\n")  # fmt: skip
    log = tmp_path / "stderr.log"
    args = [sys.executable, "-m", "ballast_asgi", "--config", str(config), "--port",
            str(port), "--admin-port", str(admin), "--workers", "2"]  # fmt: skip
    with log.open("wb") as err:
        proc = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=err)
    limits: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        with httpx.Client(timeout=5.0) as client:
            snap = client.get(f"http://127.0.0.1:{admin}/snapshot").json()
            limits.append(snap["workers"][0]["limiter"]["limit"])
            killed: set[int] = set()
            end = time.monotonic() + 60
            while time.monotonic() < end:  # polling an outside process, bounded
                snap = client.get(f"http://127.0.0.1:{admin}/snapshot").json()
                if any(m["state"] == "given_up" for m in snap["missing"]):
                    break
                pids = {w["worker"]["index"]: w["worker"]["pid"] for w in snap["workers"]}
                if pids.get(1) not in (None, *killed):
                    killed.add(pids[1])
                    os.kill(pids[1], signal.SIGKILL)
                time.sleep(0.05)
            while time.monotonic() < end:
                snap = client.get(f"http://127.0.0.1:{admin}/snapshot").json()
                if snap["workers"][0]["limiter"]["limit"] != limits[0]:
                    break
                time.sleep(0.05)
            limits.append(snap["workers"][0]["limiter"]["limit"])
            divided_by = snap["workers"][0]["worker"].get("caps_divided_by")
        assert httpx.get(f"http://127.0.0.1:{port}/x").status_code == 200
        proc.terminate()
        proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=HANG_S)
        stop_thread(server, thread)
    lines = log.read_text()
    assert limits == [5, 10] and divided_by == 1, (limits, lines)
    assert "worker.crash_loop" in lines and "worker.caps_redivided" in lines, lines

"""``workers.redivide_on_loss``: a given-up worker's share of the caps goes to the live ones."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.gateway import build_gateway
from ballast_asgi.server import supervisor as sup_mod
from ballast_asgi.server.workers import SHARE_FILE, read_live, scale_config

CONFIG = {"upstream": "http://127.0.0.1:9", "max_concurrent_requests": 10,
          "limiter": {"algorithm": "fixed"}, "proxy": {"max_connections": 100},
          "workers": {"redivide_on_loss": True}}  # fmt: skip


def test_live_workers_divide_the_reloadable_caps() -> None:
    """1 of 2 workers live: concurrency and queue by 1; start-up-only caps stay by 2."""
    config = build_config(CONFIG)
    half, whole = scale_config(config, 2), scale_config(config, 2, live=1)
    assert half.max_concurrent_requests == 5 and whole.max_concurrent_requests == 10
    assert whole.admission_queue.max_queue_size == config.admission_queue.max_queue_size
    assert half.proxy.max_connections == whole.proxy.max_connections == 50
    assert half.server.max_connections == whole.server.max_connections


def test_read_live_takes_only_a_positive_number(tmp_path: Path) -> None:
    """The live-worker file: a positive integer, anything else (or no file) is None."""
    path = tmp_path / SHARE_FILE
    assert read_live(str(path)) is None and read_live(None) is None
    for text, want in (("2", 2), ("0", None), ("-1", None), ("x", None), ("9" * 40, None)):
        path.write_text(text)
        assert read_live(str(path)) == want, text


@pytest.mark.anyio
async def test_a_worker_redivides_when_told(tmp_path: Path) -> None:
    """Worker 0 of 2 (limit 5); the supervisor writes 1 live: the limit becomes 10."""
    path = tmp_path / "gw.yaml"
    path.write_text(str(CONFIG).replace("True", "true"))  # a YAML flow mapping
    share = tmp_path / SHARE_FILE
    gw = build_gateway(scale_config(build_config(CONFIG), 2), config_path=str(path))
    gw.set_worker(0, 2, str(share))
    assert await gw.redivide() is None  # no file yet: nothing to apply
    share.write_text("1")
    result = await gw.redivide()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://g") as c:
        snap = (await c.get("/_ballast/snapshot")).json()
    assert result is not None and result[0], result
    assert snap["limiter"]["limit"] == 10 and snap["worker"]["caps_divided_by"] == 1
    assert await gw.redivide() is None  # the same count again: no second reload


def test_a_given_up_worker_tells_the_live_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real forks: slot 1 crash-loops and is given up; slot 0 is told (SIGUSR1) and reads 1."""
    monkeypatch.setattr(sup_mod, "RESTART_BASE_S", 0.001)
    monkeypatch.setattr(sup_mod, "CRASH_LIMIT", 2)
    monkeypatch.setattr(sup_mod, "emit", lambda *a, **kw: None)
    tmp = tempfile.mkdtemp()
    out = os.path.join(tmp, "seen")

    def worker(index: int, traffic: socket.socket, admin: socket.socket) -> None:
        if index == 1:
            os._exit(3)
        path = sup_mod.share_path(admin)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # pending from here on, not ignored
        told = read_live(path) == 1 or signal.sigtimedwait([signal.SIGUSR1], 20) is not None
        with open(out, "w") as f:
            f.write(f"{told} {read_live(path)}")
        os.kill(os.getppid(), signal.SIGTERM)  # stop the supervisor; it passes SIGTERM on
        time.sleep(20)  # bounded: ended by the SIGTERM

    with socket.socket() as traffic:
        sup = sup_mod.Supervisor(2, traffic, worker, tmp, redivide=True)
        for slot in sup.slots:
            sup.fork(slot)
        asyncio.run(asyncio.wait_for(sup_mod._parent(sup, None, {}), 30))
    with open(out) as f:
        seen = f.read()
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    assert sup.slots[1].state == "given_up" and sup.slots[0].state == "exited"
    assert seen == "True 1", seen

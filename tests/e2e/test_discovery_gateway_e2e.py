"""The judged scenario end to end: etcd, a uvicorn gateway with ``discovery``, two
simulators registered with ``ballast register``, traffic, churn, and etcd stopped."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.etcd_server import EtcdServer, etcd_server
from tests.e2e.support import (
    HANG_S,
    enter_together,
    free_port,
    stop_process,
    uvicorn_gateway,
    wait_http,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
#: Start-up bound: five Python processes on a busy shared machine can take a while.
READY_S = HANG_S


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


class Instance:
    """A simulator and the ``ballast register`` process that registers it."""

    def __init__(self, etcd: EtcdServer) -> None:
        self.etcd = etcd
        self.port, self.admin = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sim = _spawn("ballast_tools.upstream_sim", "--port", str(self.port), "--admin-port",
                          str(self.admin), "--workers", "32",
                          "--fast", "2ms", "--slow", "5ms")  # fmt: skip
        wait_http(f"http://127.0.0.1:{self.admin}/health", self.sim, READY_S)
        self.reg = self.register()

    def register(self) -> subprocess.Popen[bytes]:
        """Start a ``ballast register`` for this instance."""
        return _spawn("ballast_asgi", "register", "--etcd", self.etcd.url,
                      "--service", "judged", "--url", self.url, "--ttl", "5")  # fmt: skip

    def served(self) -> int:
        """Requests the simulator answered."""
        return int(httpx.get(f"http://127.0.0.1:{self.admin}/stats").json()["served"])

    def stop(self) -> None:
        """Deregister, then stop serving."""
        stop_process(self.reg)
        stop_process(self.sim)


@contextmanager
def instance(etcd: EtcdServer) -> Iterator[Instance]:
    """A registered simulator, stopped (deregistered first) on exit."""
    inst = Instance(etcd)
    try:
        yield inst
    finally:
        inst.stop()


def _snapshot(base: str) -> dict[str, object]:
    return dict(httpx.get(base + "/_ballast/snapshot", timeout=5).json())


def _wait(base: str, cond: object, seconds: float = HANG_S) -> dict[str, object]:
    limit = time.monotonic() + seconds
    while True:
        snap = _snapshot(base)
        if cond(snap):  # type: ignore[operator]
            return snap
        assert time.monotonic() < limit, f"snapshot never matched: {snap.get('discovery')}"
        time.sleep(0.05)  # condition poll, bounded


def _urls(snap: dict[str, object]) -> set[str]:
    return {i["url"] for i in snap["discovery"]["instances"]}  # type: ignore[index]


async def _load(base: str, seconds: float, rate: float = 100.0) -> list[int]:
    """Open-loop GETs at ``rate``; the status of each (0: no answer)."""
    statuses: list[int] = []

    async def one(c: httpx.AsyncClient) -> None:
        try:
            statuses.append((await c.get(base + "/work")).status_code)
        except httpx.HTTPError:
            statuses.append(0)

    async with httpx.AsyncClient(timeout=5) as c:
        tasks = []
        for i in range(int(seconds * rate)):
            tasks.append(asyncio.ensure_future(one(c)))
            await asyncio.sleep(1 / rate)  # the schedule of an open-loop client
            del i
        await asyncio.gather(*tasks)
    return statuses


def _load_in_background(base: str, seconds: float) -> tuple[list[list[int]], object]:
    import threading

    out: list[list[int]] = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(_load(base, seconds))))
    thread.start()
    return out, thread


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[EtcdServer, str, list[Instance]]]:
    """etcd, two registered simulators, and a uvicorn gateway that sees both."""
    with ExitStack() as stack:
        etcd = stack.enter_context(etcd_server())
        instances = enter_together(stack, [instance(etcd), instance(etcd)])
        config = tmp_path / "gw.yaml"
        config.write_text(
            f"discovery: {{etcd: {{endpoints: [{etcd.url}]}}, service: judged}}\n"
            "retry: {max_attempts: 3}\n"
        )
        base, _ = stack.enter_context(uvicorn_gateway(config, READY_S))
        _wait(base, lambda s: len(_urls(s)) == 2, READY_S)
        yield etcd, base, instances


def test_traffic_reaches_both_and_churn_costs_nothing(
    setup: tuple[EtcdServer, str, list[Instance]],
) -> None:
    """Both instances serve; one stopped mid-load (registration first) costs no failure."""
    _, base, (a, b) = setup
    out, thread = _load_in_background(base, 4.0)
    time.sleep(1.5)
    b.stop()
    thread.join(30)  # type: ignore[attr-defined]
    statuses = out[0]
    assert statuses.count(200) == len(statuses), {s: statuses.count(s) for s in set(statuses)}
    assert a.served() > 0
    snap = _snapshot(base)
    assert _urls(snap) == {a.url}


def test_re_registration_with_the_same_address_writes_no_version(
    setup: tuple[EtcdServer, str, list[Instance]],
) -> None:
    """A registrar killed and started again: same key and value, the version stays."""
    _, base, (a, _) = setup
    before = _snapshot(base)["config_version"]
    a.reg.send_signal(signal.SIGKILL)
    a.reg.communicate(timeout=HANG_S)
    a.reg = a.register()
    time.sleep(1.5)  # longer than the debounce: a version would have been written by now
    assert _snapshot(base)["config_version"] == before


def test_stopping_etcd_does_not_stop_traffic(
    setup: tuple[EtcdServer, str, list[Instance]],
) -> None:
    """etcd down for 3 s under load: every request is served, the version is kept."""
    etcd, base, _ = setup
    before = _snapshot(base)["config_version"]
    out, thread = _load_in_background(base, 4.0)
    time.sleep(0.5)
    etcd.stop()
    time.sleep(3.0)
    snap = _snapshot(base)
    etcd.start()
    thread.join(30)  # type: ignore[attr-defined]
    statuses = out[0]
    assert statuses.count(200) == len(statuses), {s: statuses.count(s) for s in set(statuses)}
    assert snap["config_version"] == before
    assert snap["discovery"]["etcd"]["connected"] is False  # type: ignore[index]
    _wait(base, lambda s: s["discovery"]["etcd"]["connected"] is True)


def test_an_instance_killed_before_its_registration_costs_nothing(
    setup: tuple[EtcdServer, str, list[Instance]],
) -> None:
    """SIGKILL the simulator while its registration lives on: retries cover every request."""
    _, base, (a, b) = setup
    out, thread = _load_in_background(base, 4.0)
    time.sleep(1.0)
    served_before = a.served()
    b.sim.send_signal(signal.SIGKILL)
    b.sim.communicate(timeout=HANG_S)
    thread.join(30)  # type: ignore[attr-defined]
    statuses = out[0]
    assert statuses.count(200) == len(statuses), {s: statuses.count(s) for s in set(statuses)}
    assert a.served() > served_before  # the retries and the rest went to the live one
    assert b.url in _urls(_snapshot(base))  # still registered: only its lease knows

"""The generator keeps its own schedule: pumped sends, warmed connections, the GC pause."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

import ballast_tools.loadgen.runner as runner_mod
from ballast_tools.loadgen.lean import LeanPool
from ballast_tools.loadgen.runner import Finish, LoadConfig, LoadRunner

TARGET = "http://127.0.0.1:1/"


class _FakeClient:
    """Records what the runner sends; ``auto`` answers each request on the next loop turn."""

    def __init__(self, finish: Finish, *, auto: bool = False) -> None:
        self.finish, self.auto = finish, auto
        self.sent: list[int] = []
        self.gc_enabled_at_send: list[bool] = []
        self.warmed = -1

    async def open(self) -> None:
        """Nothing to open."""

    async def warm(self, n: int) -> None:
        self.warmed = n

    def send(self, i: int, tier_id: int, budget_s: float) -> None:
        self.sent.append(i)
        self.gc_enabled_at_send.append(gc.isenabled())
        if self.auto:
            asyncio.get_running_loop().call_soon(self.finish, i, 200, None, "")

    async def close(self) -> None:
        """Nothing to close."""


def _runner(rate: float, seconds: float, **kw: object) -> tuple[LoadRunner, _FakeClient]:
    auto = bool(kw.pop("auto", False))
    r = LoadRunner(LoadConfig(target=TARGET, rate_rps=rate, duration_s=seconds, **kw))  # type: ignore[arg-type]
    fake = _FakeClient(r._finish, auto=auto)
    r._client = fake
    return r, fake


def test_pump_issues_only_what_is_due_and_at_most_its_limit() -> None:
    """A pump sends the due requests in order, no more than ``limit``, none before its time."""
    r, fake = _runner(100.0, 10.0)  # one request every 10 ms
    r._t0 = time.monotonic() - 0.055  # requests 0..5 are due
    r._offering = True
    r._pump(time.monotonic(), 4)
    assert fake.sent == [0, 1, 2, 3]
    r._pump(time.monotonic(), 4)
    assert fake.sent == [0, 1, 2, 3, 4, 5]  # 6 is 5 ms in the future
    assert all(0.0 <= lag < 0.1 for lag in r._lags[:6]) and r._lags[6] == 0.0


def test_a_completion_pumps_the_sends_that_fell_due_meanwhile() -> None:
    """A response handled while sends are due issues them from its callback."""
    r, fake = _runner(100.0, 10.0)
    r._t0 = time.monotonic() - 0.005
    r._offering = True
    r._pump(time.monotonic(), 1)
    assert fake.sent == [0]
    r._t0 -= 0.03  # meanwhile 30 ms went by: requests 1..3 are due
    r._finish(0, 200, None, "")
    assert fake.sent == [0, 1, 2, 3]
    assert r.inflight == 3


def test_a_pump_inside_a_pump_does_nothing() -> None:
    """A send whose callback re-enters the runner cannot issue a request twice."""
    r, fake = _runner(100.0, 10.0)
    r._t0 = time.monotonic() - 0.035
    r._offering = True
    inner: list[int] = []

    def send_and_reenter(i: int, tier_id: int, budget_s: float) -> None:
        fake.sent.append(i)
        r._pump(time.monotonic(), 10)
        inner.append(len(fake.sent))

    r._client.send = send_and_reenter  # type: ignore[method-assign]
    r._pump(time.monotonic(), 10)
    assert fake.sent == [0, 1, 2, 3] and inner == [1, 2, 3, 4]


@pytest.mark.anyio
async def test_the_collector_is_paused_while_offering_and_restored_after() -> None:
    """Every send happens with the cyclic GC paused; it is enabled again afterwards."""
    assert gc.isenabled()
    r, fake = _runner(400.0, 0.02, auto=True)
    result = await r.run()
    assert fake.sent == list(range(8)) and fake.gc_enabled_at_send == [False] * 8
    assert gc.isenabled() and result.gc_collections == 0
    assert sum(t.served for t in result.stats.tally) == 8


@pytest.mark.anyio
async def test_the_guard_collects_when_tracked_objects_pile_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``GC_GUARD_OBJECTS`` the paused collector runs anyway, and the run says so."""
    monkeypatch.setattr(runner_mod, "GC_GUARD_OBJECTS", -1)
    r, _ = _runner(400.0, 0.02, auto=True)
    result = await r.run()
    assert result.gc_collections == 8 and gc.isenabled()


@pytest.mark.anyio
async def test_gc_during_run_leaves_the_collector_alone() -> None:
    """``pause_gc=False`` keeps the collector running while offering."""
    r, fake = _runner(400.0, 0.02, auto=True, pause_gc=False, warm_connections=3)
    await r.run()
    assert fake.gc_enabled_at_send == [True] * 8 and fake.warmed == 3


def test_warm_connections_cannot_exceed_the_in_flight_cap() -> None:
    """``warm_connections`` is validated against ``max_inflight``."""
    with pytest.raises(ValueError, match="warm_connections"):
        LoadConfig(target=TARGET, rate_rps=1, duration_s=1, max_inflight=2, warm_connections=3)


class _Answer(asyncio.Protocol):
    """One per connection: answers every request with 200 ok."""

    accepted = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        type(self).accepted += 1
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_warmed_connections_carry_the_first_requests() -> None:
    """``warm(n)`` opens n idle connections; n requests at once then open no new one."""
    _Answer.accepted = 0
    server = await asyncio.get_running_loop().create_server(_Answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    got: list[int] = []
    all_done = asyncio.Event()

    def done(slot: int, status: int, reason: str | None, detail: str) -> None:
        got.append(status)
        if len(got) == 4:
            all_done.set()

    pool = LeanPool("127.0.0.1", port, done)
    await pool.warm(4)
    assert len(pool.idle) == 4 and len(pool.conns) == 4
    for slot in range(4):
        pool.send(slot, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5.0)
    assert not pool.connecting  # every request found a warm connection
    await all_done.wait()
    assert got == [200] * 4 and _Answer.accepted == 4
    await pool.close()
    server.close()


@pytest.mark.anyio
async def test_warming_a_closed_port_opens_nothing_and_does_not_fail() -> None:
    """Connections that cannot be opened are skipped; the schedule connects on demand."""
    server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = LeanPool("127.0.0.1", port, lambda *a: None)
    await pool.warm(3)
    assert not pool.idle and not pool.conns
    await pool.close()

"""The shared modes against a real redis-server on a free loopback port (no fakes)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, cast

import pytest

from ballast_asgi.config.ratelimit import RateLimitConfig
from ballast_asgi.core.types import Clock
from ballast_asgi.ratelimit.client import RedisClient, RedisUnavailable
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.factory import RateLimiter, make_limiter
from ballast_asgi.ratelimit.lease import LeaseLimiter
from ballast_asgi.ratelimit.redis_mode import RedisLimiter
from ballast_asgi.ratelimit.shared import SharedBase
from ballast_asgi.ratelimit.sync import SyncLimiter, SyncState
from experiments._harness.procs import free_port
from experiments._harness.redis import RedisProcess, redis_server, start_redis
from experiments.ratelimit.delayproxy import DelayProxy
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisProcess]:
    """One redis-server for the module, stopped by PID at the end."""
    with redis_server() as server:
        yield server


def _limiter(
    url: str, mode: str, prefix: str, clock: Clock = time.monotonic, **extra: Any
) -> RateLimiter:
    cfg = RateLimitConfig(enabled=True, mode=mode, redis_url=url, key_prefix=prefix, **extra)  # type: ignore[arg-type]
    return make_limiter(cfg, clock=clock)


async def _drive(limiters: list[RateLimiter], n: int, limits: Limits, gap_s: float = 0.0) -> int:
    admitted = 0
    for i in range(n):
        decision = await limiters[i % len(limiters)].decide("k", limits)
        admitted += decision.allowed
        if gap_s:
            await asyncio.sleep(gap_s)  # pacing the offered load, not waiting for a result
    return admitted


@pytest.mark.parametrize("mode", ["redis", "lease"])
async def test_two_gateways_share_one_bucket(redis: RedisProcess, mode: str) -> None:
    """Two limiters on one key admit the burst between them, not twice the burst."""
    prefix = uuid.uuid4().hex
    pair = [_limiter(redis.url, mode, prefix, redis_timeout_ms=1000) for _ in range(2)]
    try:
        admitted = await _drive(pair, 60, Limits(0.5, 10))
    finally:
        for lim in pair:
            await lim.close()
    assert admitted == 10
    assert all(lim.stats.decisions[("allowed", "degraded")] == 0 for lim in pair)


async def test_sync_mode_splits_the_limit_by_demand(redis: RedisProcess) -> None:
    """Two sync limiters over 0.6 s admit about burst + rate * t in total, never on the path."""
    prefix = uuid.uuid4().hex
    pair = [_limiter(redis.url, "sync", prefix, sync_interval_ms=20) for _ in range(2)]
    limits = Limits(200.0, 20)
    start = time.monotonic()
    try:
        admitted = await _drive(pair, 600, limits, gap_s=0.001)
    finally:
        for lim in pair:
            await lim.close()
    elapsed = time.monotonic() - start
    perfect = limits.burst + limits.rate_per_s * elapsed
    # Never over; the lower bound is loose because a starved event loop (a loaded CI
    # machine) delays the 20 ms reconcile, and the shares then lag the demand.
    assert 0.6 * perfect <= admitted <= 1.1 * perfect
    assert sum(lim.stats.redis_calls[("sync", "ok")] for lim in pair) >= 2


async def test_heartbeats_count_live_gateways(redis: RedisProcess) -> None:
    """Three limiters on one prefix each see three live gateways."""
    prefix = uuid.uuid4().hex
    trio = [_limiter(redis.url, "redis", prefix, redis_timeout_ms=1000) for _ in range(3)]
    try:
        for lim in trio:
            await lim.heartbeat()  # type: ignore[attr-defined]
        await trio[0].heartbeat()  # type: ignore[attr-defined]
        assert trio[0].live_gateways() == 3
    finally:
        for lim in trio:
            await lim.close()


async def test_lease_calls_carry_the_heartbeat(redis: RedisProcess) -> None:
    """Each lease call is also a heartbeat: the twin is counted, no periodic trip while busy."""
    prefix = uuid.uuid4().hex
    clock = FakeClock()
    extra = {"redis_timeout_ms": 1000, "heartbeat_ms": 1000, "lease": {"max_tokens": 2}}
    a, b = (_limiter(redis.url, "lease", prefix, clock, **extra) for _ in range(2))
    assert isinstance(a, LeaseLimiter) and isinstance(b, LeaseLimiter)
    for lim in (a, b):
        lim._started = True  # no background loops: the test runs the periodic step itself
    limits = Limits(0.001, 100)
    try:
        assert (await a.decide("k", limits)).allowed
        assert (await b.decide("k", limits)).allowed
        assert b.live_gateways() == 2  # a's lease call put it in the set
        leases = a.stats.redis_calls[("lease", "ok")]
        for _ in range(6):  # spends the 2-token leases: at least one more lease call
            assert (await a.decide("k", limits)).allowed
        assert a.stats.redis_calls[("lease", "ok")] > leases
        assert a.live_gateways() == 2
        await a._heartbeat_if_due()  # a lease call answered within the period: no trip
        assert a.stats.redis_calls[("heartbeat", "ok")] == 0
        clock.advance(0.4)  # within half a period of a lease call: still no trip
        await a._heartbeat_if_due()
        assert a.stats.redis_calls[("heartbeat", "ok")] == 0
        clock.advance(0.2)  # over half a period without a lease call: the heartbeat is due
        await a._heartbeat_if_due()
        assert a.stats.redis_calls[("heartbeat", "ok")] == 1
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("mode", ["redis", "lease"])
async def test_the_own_share_counts_what_redis_admitted(redis: RedisProcess, mode: str) -> None:
    """What Redis admitted for a gateway comes out of its own share: deciding alone, it refuses."""
    clock = FakeClock()  # no refill between the calls
    extra: dict[str, Any] = {"redis_timeout_ms": 1000}
    if mode == "lease":
        extra["lease"] = {"max_tokens": 10}
    lim = _limiter(redis.url, mode, uuid.uuid4().hex, clock, **extra)
    limits = Limits(0.01, 10)
    try:
        assert sum([(await lim.decide("k", limits)).allowed for _ in range(10)]) == 10
        assert not lim.degrade("k", limits, clock.now).allowed  # type: ignore[attr-defined]
        fresh = _limiter(redis.url, mode, uuid.uuid4().hex, clock, **extra)
        assert fresh.degrade("k", limits, clock.now).allowed  # type: ignore[attr-defined]
        await fresh.close()
    finally:
        await lim.close()


async def test_lease_with_the_breaker_open_decides_alone_without_waiting(
    redis: RedisProcess,
) -> None:
    """With the Redis breaker open a lease gateway decides on its share at once: no refill."""
    clock = FakeClock()
    lim = _limiter(redis.url, "lease", uuid.uuid4().hex, clock, redis_timeout_ms=1000)
    assert isinstance(lim, LeaseLimiter)
    lim._started = True  # no background loops
    for _ in range(5):
        lim.breaker.record(False, clock.now)
    assert lim.breaker_state() == "open"
    try:
        decision = await lim.decide("k", Limits(10.0, 5))
        assert decision.degraded and decision.allowed
        assert lim.stats.lease_requests == 0 and lim.leases.peek("k").pending is None  # type: ignore[union-attr]
    finally:
        await lim.close()


async def test_heartbeats_and_give_backs_go_through_an_open_breaker(redis: RedisProcess) -> None:
    """The breaker guards the request path only: peers keep counting a gateway, tokens return."""
    clock = FakeClock()
    prefix = uuid.uuid4().hex
    a = _limiter(redis.url, "redis", prefix, clock, redis_timeout_ms=1000)
    b = _limiter(redis.url, "redis", prefix, clock, redis_timeout_ms=1000)
    assert isinstance(a, RedisLimiter) and isinstance(b, RedisLimiter)
    limits = Limits(0.01, 3)
    try:
        await b.heartbeat()
        for _ in range(5):
            a.breaker.record(False, clock.now)
        assert a.breaker_state() == "open"
        await a.heartbeat()
        assert a.live_gateways() == 2
        assert sum([(await b.decide("k", limits)).allowed for _ in range(3)]) == 3
        await a._give_back_one("k", limits)  # with its breaker open
        assert a.breaker_state() == "open"  # bookkeeping calls do not move it
        assert (await b.decide("k", limits)).allowed  # the token came back
    finally:
        await a.close()
        await b.close()


async def test_a_full_connection_pool_is_not_a_failing_redis(redis: RedisProcess) -> None:
    """More calls in flight than pooled connections: the extra one fails, Redis is not failing."""
    client = RedisClient(redis.url, max_connections=1)
    lim = RedisLimiter(client, prefix=uuid.uuid4().hex, timeout_s=1.0)
    lim._started = True  # no background loops
    limits = Limits(1000.0, 100)
    try:
        first, second = await asyncio.gather(lim.decide("k", limits), lim.decide("k", limits))
        assert not first.degraded and second.degraded  # the second found no free connection
        assert (
            lim.stats.redis_calls[("gcra_demand", "ok")] + lim.stats.redis_calls[("gcra", "ok")]
            == 1
        )
        assert not lim.failing
    finally:
        await lim.close()


async def test_a_request_decided_alone_is_decided_at_its_decision_time(
    redis: RedisProcess,
) -> None:
    """After a missed deadline the own share is asked with the time of the decision."""
    proxy = DelayProxy(redis.port, 0.05).start()
    times = iter([0.0, 0.0, 10.0, 10.0, 10.0, 10.0])
    lim = _limiter(proxy.url, "redis", uuid.uuid4().hex, lambda: next(times, 10.0),
                   redis_timeout_ms=2)  # fmt: skip
    assert isinstance(lim, RedisLimiter)
    lim._started = True
    limits = Limits(1.0, 2)
    try:
        decision = await lim.decide("k", limits)
        assert decision.degraded and decision.allowed
        tat = lim.fallback.table.peek("k")
        assert tat is not None and tat >= 10.0  # the bucket was charged at 10 s, not at 0
    finally:
        await lim.close()
        proxy.stop()


async def test_a_gateway_counts_as_live_for_three_periods_and_at_least_three_seconds(
    redis: RedisProcess,
) -> None:
    """The live set's time to live: 3 heartbeat periods, never under 3 s (loop stalls)."""
    fast = _limiter(redis.url, "redis", uuid.uuid4().hex, heartbeat_ms=500)
    slow = _limiter(redis.url, "redis", uuid.uuid4().hex, heartbeat_ms=2000)
    try:
        assert fast.live_ttl_s == 3.0 and fast.beat_args()[1] == 3.0  # type: ignore[attr-defined]
        assert slow.live_ttl_s == 6.0  # type: ignore[attr-defined]
    finally:
        await fast.close()
        await slow.close()


async def test_stopped_redis_degrades_to_the_local_share_then_charges_back() -> None:
    """With Redis gone decisions come at once from limit/live; after restart the charge lands."""
    server = start_redis()
    port = server.port
    clock = FakeClock()  # the breaker's open time and the local share move only when told
    lim = _limiter(
        server.url, "redis", uuid.uuid4().hex, clock, redis_timeout_ms=50, charge_back=True
    )
    assert isinstance(lim, SharedBase)
    limits = Limits(1.0, 10)
    try:
        await lim.client.warm_up()
        assert not (await lim.decide("k", limits)).degraded
        server.kill()
        start = time.perf_counter()
        admitted = int((await lim.decide("k", limits)).allowed)  # finds out: its call fails
        assert time.perf_counter() - start < 0.1 and lim.failing
        for _ in range(29):  # Redis is failing: no decision waits for its call
            admitted += _without_suspending(lim.decide("k", limits)).allowed
        # The share counts what Redis admitted: one of its ten tokens went through Redis.
        assert admitted == 9
        assert lim.stats.decisions[("allowed", "degraded")] == 9
        for _ in range(200):
            if lim.breaker_state() != "closed":
                break
            await asyncio.sleep(0.005)  # the calls nobody waited for fail in the background
        assert lim.breaker_state() in ("open", "half_open")
        server = start_redis(port)
        await lim.client.warm_up()
        clock.advance(0.15)  # past the breaker's open time (100 ms)
        first = await lim.decide("k", limits)  # its call (the probe) finds Redis back
        assert first.degraded and not first.allowed  # decided alone; the share is spent
        for _ in range(200):
            if lim.stats.charged_back and lim.stats.redis_calls[("give_back", "ok")]:
                break
            await asyncio.sleep(0.005)  # the late answer, give-back and charge-back land
        assert lim.stats.charged_back == 9 and not lim.failing
        # Redis admitted the probe's request the gateway refused: that token went back. The
        # charge emptied the bucket, up to what it refilled (1/s) while Redis restarted.
        decisions = [await lim.decide("k", limits) for _ in range(2)]
        assert not any(d.degraded for d in decisions) and not decisions[-1].allowed
    finally:
        await lim.close()
        server.stop()


def _without_suspending(coro: Coroutine[Any, Any, Decision]) -> Decision:
    """Run ``coro`` to its end in one step; fail if it awaits anything that suspends."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(Decision, done.value)
    coro.close()
    raise AssertionError("the decision waited for something")


@pytest.mark.parametrize("mode", ["redis", "lease"])
async def test_once_a_call_failed_no_request_waits_for_redis(mode: str) -> None:
    """After one failed call (Redis refused) every decision returns without suspending."""
    server = start_redis()
    lim = _limiter(server.url, mode, uuid.uuid4().hex, redis_timeout_ms=1000)
    assert isinstance(lim, SharedBase)
    lim._started = True  # no background loops: only request-path calls
    limits = Limits(1000.0, 100)
    try:
        await lim.client.warm_up()
        server.kill()
        await lim.decide("k", limits)  # this one may wait: Redis was fine until now
        for _ in range(100):
            if lim.failing:
                break
            await asyncio.sleep(0.005)  # the refill (lease) fails in the background
        assert lim.failing
        for _ in range(20):
            assert _without_suspending(lim.decide("k", limits)).degraded
    finally:
        await lim.close()
        server.stop()


async def test_redis_mode_own_share_follows_demand(redis: RedisProcess) -> None:
    """Under a 90/10 split the busy gateway's own share is about 90 % of the limit."""
    clock = FakeClock()
    prefix = uuid.uuid4().hex
    busy = _limiter(redis.url, "redis", prefix, clock, redis_timeout_ms=1000, demand_ms=100)
    idle = _limiter(redis.url, "redis", prefix, clock, redis_timeout_ms=1000, demand_ms=100)
    assert isinstance(busy, RedisLimiter) and isinstance(idle, RedisLimiter)
    limits = Limits(1000.0, 100)
    try:
        for step in range(1000):  # 1 s at 1,000 requests/s: 900 to one gateway, 100 to the other
            clock.advance(0.001)
            await (idle if step % 10 == 0 else busy).decide("k", limits)
        busy.live = idle.live = 2
        assert busy.share("k", clock.now) == pytest.approx(0.9, abs=0.03)
        assert idle.share("k", clock.now) == pytest.approx(0.1, abs=0.03)
        clock.advance(2.0)  # no answer for longer than stale_s: back to an even split
        assert busy.share("k", clock.now) == 0.5
    finally:
        await busy.close()
        await idle.close()


async def test_slow_redis_never_makes_a_request_wait_past_the_timeout(
    redis: RedisProcess,
) -> None:
    """Behind a 300 ms delaying proxy every decision returns within the 2 ms timeout (+ slack)."""
    proxy = DelayProxy(redis.port, 0.3).start()
    lim = _limiter(proxy.url, "redis", uuid.uuid4().hex, redis_timeout_ms=2)
    try:
        worst = 0.0
        for _ in range(40):
            start = time.perf_counter()
            await lim.decide("k", Limits(1000.0, 100))
            worst = max(worst, time.perf_counter() - start)
        assert worst < 0.1  # far below the 300 ms Redis answer time
        assert lim.stats.decisions[("allowed", "degraded")] == 40
        assert lim.breaker_state() != "closed"
    finally:
        await lim.close()
        proxy.stop()


def _late_gcra(lim: RateLimiter) -> int:
    """GCRA answers that came after the deadline (the first call of a key publishes demand)."""
    calls = lim.stats.redis_calls
    return calls[("gcra", "late")] + calls[("gcra_demand", "late")]


async def test_late_answers_are_reconciled(redis: RedisProcess) -> None:
    """A call that misses its deadline but succeeds later cancels its pending charge."""
    proxy = DelayProxy(redis.port, 0.01).start()
    lim = _limiter(proxy.url, "redis", uuid.uuid4().hex, redis_timeout_ms=1)
    try:
        decision = await lim.decide("k", Limits(100.0, 10))
        assert decision.degraded and decision.allowed
        for _ in range(100):
            if _late_gcra(lim):
                break
            await asyncio.sleep(0.005)  # the late answer arrives in the background
        assert _late_gcra(lim) == 1
        for _ in range(100):
            if not len(lim.charges):  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.005)  # the flush after the late answer runs in the background
        assert lim.stats.charged_back == 0  # Redis counted it itself: nothing to charge
    finally:
        await lim.close()
        proxy.stop()


async def test_late_admission_of_a_refused_request_returns_the_token(redis: RedisProcess) -> None:
    """Redis admitting (late) what the gateway refused on its share gives the token back."""
    proxy = DelayProxy(redis.port, 0.01).start()
    prefix = uuid.uuid4().hex
    lim = _limiter(proxy.url, "redis", prefix, redis_timeout_ms=1)
    limits = Limits(0.01, 2)
    try:
        lim.fallback.decide("k", limits, time.monotonic())  # the local share is now empty
        lim.fallback.decide("k", limits, time.monotonic())
        decision = await lim.decide("k", limits)
        assert decision.degraded and not decision.allowed
        for _ in range(200):
            if lim.stats.redis_calls[("give_back", "ok")]:
                break
            await asyncio.sleep(0.005)  # the late answer and the give-back run in the background
        assert lim.stats.redis_calls[("give_back", "ok")] == 1
        direct = _limiter(redis.url, "redis", prefix, redis_timeout_ms=1000)
        try:
            assert sum([(await direct.decide("k", limits)).allowed for _ in range(3)]) == 2
        finally:
            await direct.close()
    finally:
        await lim.close()
        proxy.stop()


async def test_lease_gives_back_unspent_tokens(redis: RedisProcess) -> None:
    """An expired lease's unspent tokens return to the shared bucket for another gateway."""
    prefix = uuid.uuid4().hex
    extra = {"redis_timeout_ms": 1000, "lease": {"ttl_ms": 30, "max_tokens": 8}}
    clock = FakeClock()
    a, b = (_limiter(redis.url, "lease", prefix, clock, **extra) for _ in range(2))
    assert isinstance(a, LeaseLimiter)
    limits = Limits(0.1, 10)
    try:
        assert (await a.decide("k", limits)).allowed
        clock.advance(0.031)  # past the lease ttl
        await a.sweep()
        for _ in range(200):
            if a.stats.redis_calls[("give_back", "ok")]:
                break
            await asyncio.sleep(0.005)  # the give-back call runs in the background
        got = [(await b.decide("k", limits)).allowed for _ in range(12)]
        assert sum(got) == 9  # 10 - the one a spent
        assert a.stats.lease_tokens_returned >= 1
    finally:
        await a.close()
        await b.close()


async def test_client_wrapper_reloads_flushed_scripts(redis: RedisProcess) -> None:
    """After SCRIPT FLUSH the wrapper loads the script again; a dead port is RedisUnavailable."""
    client = RedisClient(redis.url)
    try:
        await client.run("heartbeat", ["hb-" + uuid.uuid4().hex], ["me", 3])
        await client._conn().script_flush()
        assert int(await client.run("heartbeat", ["hb-" + uuid.uuid4().hex], ["me", 3])) == 1
    finally:
        await client.close()
    dead = RedisClient(f"redis://127.0.0.1:{free_port()}/0")
    start = time.perf_counter()
    with pytest.raises(RedisUnavailable):
        await dead.run("leave", ["x"], ["me"])
    # At once: the drivers' deadline and breaker are the policy, nothing may retry below them.
    assert time.perf_counter() - start < 1.0
    await dead.close()


async def _offer(lim: SyncLimiter, clock: FakeClock, until: float, rate: float) -> None:
    """Decide one request every ``1 / rate`` seconds of ``clock`` up to ``until``."""
    while clock.now + 1.0 / rate <= until:
        clock.advance(1.0 / rate)
        await lim.decide("k", Limits(1000.0, 100))


async def test_sync_shares_of_a_new_key_never_add_up_to_more_than_the_limit(
    redis: RedisProcess,
) -> None:
    """A gateway that syncs a new key 10 ms after its first request must not make the other
    take more than what is left.

    The bug (2026-12-01, +1.1 % at 150 % in the experiment, all of it in a new key's first
    0.5 s): gateway A published a 10 ms-old demand estimate (about 150/s for a real 750/s),
    B then read a total below the limit and gave itself 0.8 of it while A still held 0.5.
    """
    prefix = uuid.uuid4().hex
    clocks = [FakeClock(0.0), FakeClock(0.0)]
    pair = [
        cast(SyncLimiter, _limiter(redis.url, "sync", prefix, clock=c, sync_interval_ms=60_000))
        for c in clocks
    ]
    try:
        for _ in range(2):  # the second heartbeat round sees both gateways
            for lim in pair:
                await lim.start()
        a, b = pair
        await _offer(a, clocks[0], 0.01, 750.0)
        await a.sync_once()
        await _offer(b, clocks[1], 0.1, 750.0)
        await b.sync_once()
        shares = [cast(SyncState, lim.states.get("k")).share for lim in pair]
        assert sum(shares) <= 1.0 + 1e-9
        for until in (0.21, 0.3):  # both estimates mature: the split follows demand again
            for lim, clock in zip(pair, clocks, strict=True):
                await _offer(lim, clock, until, 750.0)
                await lim.sync_once()
        shares = [cast(SyncState, lim.states.get("k")).share for lim in pair]
        assert sum(shares) == pytest.approx(1.0, abs=0.02)
        assert shares[0] == pytest.approx(0.5, abs=0.05)
    finally:
        for lim in pair:
            await lim.close()


def test_redis_started_on_a_port_taken_meanwhile_starts_again_on_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The port picked for redis is taken before it binds (a shared machine): a fresh port."""
    import socket

    from experiments._harness import redis as harness

    taken = socket.create_server(("127.0.0.1", 0))  # listening: redis cannot bind it
    ports = iter([taken.getsockname()[1], free_port()])
    monkeypatch.setattr(harness, "free_port", lambda: next(ports))
    try:
        server = harness.start_redis()
        try:
            assert server.port != taken.getsockname()[1] and server.proc.poll() is None
        finally:
            server.stop()
    finally:
        taken.close()

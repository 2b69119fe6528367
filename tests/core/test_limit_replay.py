"""Replays of recorded sample sequences: the limits over time stay bit-identical.

The gradient controller and the limiter around it were restructured for CPU
(fewer calls and objects per sample, issue 31). These replays feed the same
seeded sequences through them and compare a digest of every intermediate
state (the limit, its float value, the floor, the window and probe counts,
the limiter's counters and windows after each step) with the one recorded on
the tree before the change, so the rewrite cannot move a single limit.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

import pytest

from ballast_asgi.core.limit import GradientLimit, LimitAlgorithm, Sample, make_limit
from ballast_asgi.core.limit.base import result_feed
from ballast_asgi.core.limiter import Limiter, Permit
from ballast_asgi.core.outcome import Outcome

#: Digests recorded by running these replays on the tree before the rewrite (5d433b2).
GOLDEN_GRADIENT = {
    "routes": "bfe5b82f2cc4f59cccf67320f69f06f9d52e686f72c2f8200fb22985e2166ec4",
    "one_floor": "0a481463ea935ee8fa8c7bc7118e211d156e1442f5918ac5329afd4217142ba2",
    "fast": "20aafbcc72929a34805b462a2b889165c6066bec8d877cda4cb7183b768f050f",
}
GOLDEN_LIMITER = {
    "partitioned": "a5a685b9886ae13b768cb01257a6a465f8d2ef640686e5a13e626a8c05b61d91",
    "own_routes": "72b5285d1f898004e1a169439fdb8f131cbd11414b748de3b79c6db9fdf878d8",
    "single": "61a75eb27f4337cedb125e3f7f87e8269f85d5a564be91d5b0f90423621dc41d",
    "capped": "ae904ef0033b44f6441ef89b22916e384edbea03f1fb0b0cb730fb0ed1e04a2a",
}

ROUTES = {"/fast": 0.002, "/slow": 0.040, "/mid": 0.010}


def _gradient_state(g: GradientLimit) -> str:
    noload, recent = g.rtt_noload_s, g.rtt_recent_s
    return (
        f"{g.limit}|{float(g._limit).hex()}|{noload and noload.hex()}|{recent and recent.hex()}"
        f"|{g.probing}|{g.windows}|{g.probes}"
    )


def _replay_gradient(g: GradientLimit, seed: int, steps: int) -> str:
    """Feed ``steps`` samples of a queueing backend with phases; digest every state."""
    rng = random.Random(seed)
    digest = hashlib.sha256()
    now = 100.0
    names = list(ROUTES)
    for i in range(steps):
        phase = (i // 700) % 5  # calm, overload, slower backend, idle gaps, failures
        route = names[rng.randrange(len(names))]
        held = max(1, int(g.limit * rng.uniform(0.3, 1.1)))
        slow = 3.0 if phase == 2 else 1.0
        queue = max(0.0, held - 12) * 0.0015 if phase in (1, 2) else 0.0
        rtt = ROUTES[route] * slow * rng.uniform(0.9, 1.3) + queue
        now += 0.0005 if phase != 3 else rng.choice((0.0005, 0.0005, 1.7))
        dropped = phase == 4 and rng.random() < 0.2
        lag = rng.choice((0.0, 0.0, 0.0003))
        limit_at = rng.choice((0, g.limit, g.limit + 3))
        sample = Sample(now - rtt, rtt, held, dropped, limit_at, lag, route)
        g.on_sample(sample, now)
        digest.update(_gradient_state(g).encode())
    digest.update(repr(sorted(g.snapshot().items(), key=lambda kv: kv[0])).encode())
    return digest.hexdigest()


GRADIENTS: dict[str, Callable[[], GradientLimit]] = {
    "routes": lambda: GradientLimit(rng=random.Random(3)),
    "one_floor": lambda: GradientLimit(route_baselines=False, rng=random.Random(4)),
    "fast": lambda: GradientLimit(
        window_ms=50,
        fast_close_samples=5,
        probe_interval_s=2.0,
        slow_start_step=1.0,
        initial_limit=8,
        route_baselines=False,
        rng=random.Random(5),
    ),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradient_replay_is_bit_identical(name: str) -> None:
    """A recorded sample sequence gives exactly the recorded limits, floors and windows."""
    assert _replay_gradient(GRADIENTS[name](), seed=11, steps=7000) == GOLDEN_GRADIENT[name]


def _limiter_state(lim: Limiter, now: float) -> str:
    parts = sorted((k, p.inflight, p.algorithm.limit) for k, p in lim._parts.items())
    rtt_min, recent = lim.rtt_min_s, lim.rtt_recent_s
    return (
        f"{lim.limit}|{lim.inflight}|{lim.acquired}|{lim.rejected}|{lim.double_releases}"
        f"|{rtt_min and rtt_min.hex()}|{recent and recent.hex()}"
        f"|{lim.throughput_rps(now).hex()}|{parts}"
    )


def _replay_limiter(lim: Limiter, seed: int, steps: int) -> str:
    """Acquire and release through the limiter with every outcome; digest every state."""
    rng = random.Random(seed)
    digest = hashlib.sha256()
    now = 50.0
    held: list[tuple[float, Permit]] = []
    names = [*ROUTES, "/other", ""]
    for i in range(steps):
        phase = (i // 900) % 4
        now += rng.choice((0.0004, 0.0009, 0.002)) if phase != 3 else rng.choice((0.001, 12.0))
        route = names[rng.randrange(len(names))]
        full = lim.full(now, route)
        room = lim.has_capacity(route)
        permit = lim.try_acquire(now, route)
        digest.update(f"{full}|{room}|{permit is None}".encode())
        if permit is not None:
            base = ROUTES.get(route, 0.005) * (2.5 if phase == 1 else 1.0)
            held.append((now + base * (1 + lim.inflight / 10) * rng.uniform(0.9, 1.2), permit))
            digest.update(
                f"{permit.route}|{permit.inflight_at_start}|{permit.limit_at_start}".encode()
            )
        while held and (len(held) > 24 or rng.random() < 0.6):
            done, permit = held.pop(rng.randrange(len(held)))
            at = max(now, done)
            outcome = rng.choice((Outcome.SUCCESS,) * 8 + (Outcome.DROPPED, Outcome.IGNORED))
            rtt = None if rng.random() < 0.5 else at - permit.start
            permit.release(outcome, at, rtt)
            if rng.random() < 0.02:
                permit.release(Outcome.SUCCESS, at)  # a double release: counted
            now = at
            digest.update(_limiter_state(lim, now).encode())
    for _, permit in held:
        permit.release(Outcome.IGNORED, now)
    digest.update(_limiter_state(lim, now).encode())
    return digest.hexdigest()


def _partition(rng_seed: int) -> Callable[[bool], LimitAlgorithm]:
    rng = random.Random(rng_seed)

    def build(quiet: bool) -> GradientLimit:
        return GradientLimit(initial_limit=64 if quiet else 20, rng=rng)

    return build


LIMITERS: dict[str, Callable[[], Limiter]] = {
    "partitioned": lambda: Limiter(
        GradientLimit(rng=random.Random(6)),
        partition=_partition(7),
        max_partitions=4,
        partition_idle_s=5.0,
    ),
    "own_routes": lambda: Limiter(
        GradientLimit(rng=random.Random(8)),
        partition=_partition(9),
        own_routes=frozenset({"/slow"}),
        max_limit=60,
    ),
    "single": lambda: Limiter(GradientLimit(rng=random.Random(10))),
    "capped": lambda: Limiter(make_limit("aimd", initial_limit=30), max_limit=12),
}


@pytest.mark.parametrize("name", sorted(LIMITERS))
def test_limiter_replay_is_bit_identical(name: str) -> None:
    """Acquires and releases replayed through a limiter give exactly the recorded states."""
    assert _replay_limiter(LIMITERS[name](), seed=21, steps=6000) == GOLDEN_LIMITER[name]


class _Recording(GradientLimit):
    """A gradient whose ``on_sample`` is overridden: it must still see every sample."""

    def __init__(self) -> None:
        super().__init__(rng=random.Random(1))
        self.seen: list[Sample] = []

    def on_sample(self, sample: Sample, now: float) -> int:
        self.seen.append(sample)
        return super().on_sample(sample, now)


def test_an_overridden_on_sample_still_gets_samples() -> None:
    """The limiter skips the ``Sample`` only for an algorithm whose ``on_sample`` just unpacks."""
    algorithm = _Recording()
    assert result_feed(algorithm) is None
    assert result_feed(GradientLimit()) is not None
    assert result_feed(make_limit("aimd")) is None
    limiter = Limiter(algorithm)
    permit = limiter.try_acquire(1.0, "/a")
    assert permit is not None
    permit.release(Outcome.SUCCESS, 1.25)
    assert algorithm.seen == [Sample(1.0, 0.25, 1, False, 20, 0.0, "/a")]


def test_on_result_is_on_sample_without_the_sample() -> None:
    """Feeding fields to ``on_result`` moves the limit exactly as ``on_sample`` does."""
    one, two = GradientLimit(rng=random.Random(2)), GradientLimit(rng=random.Random(2))
    rng = random.Random(5)
    for i in range(3000):
        now = 10.0 + i * 0.001
        rtt = rng.uniform(0.001, 0.02)
        fields = (now - rtt, rtt, rng.randrange(1, 40), rng.random() < 0.05, 20, 0.0001, "/r")
        assert one.on_sample(Sample(*fields), now) == two.on_result(*fields, now)
        assert _gradient_state(one) == _gradient_state(two)

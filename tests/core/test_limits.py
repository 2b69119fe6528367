"""Contract tests run over every limit algorithm (bounds, drops, not binding)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast_asgi.core.limit import ALGORITHMS, LimitAlgorithm, Sample, make_limit

MIN, INITIAL, MAX = 4, 20, 200

Factory = Callable[[], LimitAlgorithm]


def _factory(name: str) -> Factory:
    def build() -> LimitAlgorithm:
        if name == "fixed":
            return make_limit(name, limit=INITIAL)
        return make_limit(name, initial_limit=INITIAL, min_limit=MIN, max_limit=MAX, window_ms=100)

    return build


FACTORIES = {name: _factory(name) for name in ALGORITHMS}
NAMES = sorted(ALGORITHMS)

steps = st.lists(
    st.tuples(
        st.floats(0.0, 0.5),  # time advance (s)
        st.floats(0.0, 3.0),  # rtt (s)
        st.floats(0.0, 3.0),  # inflight as a fraction of the current limit
        st.booleans(),  # dropped
        st.floats(0.0, 1.5),  # the gateway's loop lag, as a multiple of the rtt (ADR 0010)
    ),
    max_size=300,
)
Step = tuple[float, float, float, bool, float]


def _feed(
    algo: LimitAlgorithm, now: float, dt: float, rtt: float, frac: float, drop: bool, lag: float
) -> float:
    now += dt
    inflight = int(frac * algo.limit)
    algo.on_sample(Sample(now - rtt, rtt, inflight, drop, lag_s=lag * rtt), now)
    return now


def _bounds(algo: LimitAlgorithm, name: str) -> tuple[int, int]:
    return (INITIAL, INITIAL) if name == "fixed" else (MIN, MAX)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(seq=steps)
def test_limit_stays_within_bounds(name: str, seq: list[Step]) -> None:
    """Any sample sequence keeps the limit within [min_limit, max_limit]."""
    algo = FACTORIES[name]()
    low, high = _bounds(algo, name)
    now = 0.0
    for dt, rtt, frac, drop, lag in seq:
        now = _feed(algo, now, dt, rtt, frac, drop, lag)
        assert low <= algo.limit <= high


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(seq=steps)
def test_no_growth_on_drops(name: str, seq: list[Step]) -> None:
    """A run of dropped samples never raises the limit above where it started."""
    algo = FACTORIES[name]()
    now = 0.0
    for dt, rtt, frac, _, lag in seq:
        now = _feed(algo, now, dt, rtt, frac, True, lag)
        assert algo.limit <= INITIAL


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(seq=steps)
def test_no_growth_when_not_binding(name: str, seq: list[Step]) -> None:
    """Successes with in-flight below half the limit never raise the limit."""
    algo = FACTORIES[name]()
    now = 0.0
    for dt, rtt, frac, _, lag in seq:
        now = _feed(algo, now, dt, rtt, min(frac, 0.49), False, lag)
        assert algo.limit <= INITIAL


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_is_json_safe(name: str) -> None:
    """Every algorithm's snapshot names it and holds only JSON-safe values."""
    import json

    algo = FACTORIES[name]()
    algo.on_sample(Sample(0.0, 0.03, 1, False), 0.03)
    snap = algo.snapshot()
    assert snap["name"] == name
    json.dumps(snap)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "fixed"])
def test_grows_when_binding_at_low_latency(name: str) -> None:
    """Steady low latency with the limit binding raises the limit."""
    algo = FACTORIES[name]()
    now = 0.0
    for _ in range(400):
        now += 0.005
        algo.on_sample(Sample(now - 0.02, 0.02, algo.limit, False), now)
    assert algo.limit > INITIAL


def test_make_limit_rejects_unknown_names() -> None:
    """An unknown algorithm name is a ValueError listing the allowed ones."""
    with pytest.raises(ValueError, match="gradient"):
        make_limit("nope")


def test_make_limit_drops_common_params_the_algorithm_lacks() -> None:
    """Config-wide parameters are passed only to algorithms that take them."""
    fixed = make_limit("fixed", initial_limit=7, min_limit=1, max_limit=9, window_ms=500)
    assert fixed.limit == 7


def test_make_limit_rejects_unknown_specific_params() -> None:
    """A parameter no algorithm knows is a TypeError, not silently ignored."""
    with pytest.raises(TypeError):
        make_limit("aimd", bogus=1)


def test_the_common_parameters_taken_are_those_of_each_signature() -> None:
    """``make_limit``'s table of common parameters is each ``__init__``'s, read from the
    source (a compiled core has no signature to read, hence the table)."""
    import inspect

    from ballast_asgi.core.limit import COMMON_PARAMS, TAKES
    from tests.pure import pure

    for name, cls in ALGORITHMS.items():
        source = getattr(pure(cls.__module__), cls.__name__)
        taken = set(inspect.signature(source.__init__).parameters) & COMMON_PARAMS
        assert TAKES[name] == taken, name

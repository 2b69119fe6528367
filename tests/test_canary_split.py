"""The split: weights, stickiness per key, monotone ramps, no canary after a rollback."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from ballast_asgi.canary.blocks import Version
from ballast_asgi.canary.split import Split

keys = st.binary(min_size=1, max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b)


@given(keys, st.floats(0.0, 1.0))
def test_one_user_always_sees_one_version(user: bytes, weight: float) -> None:
    """The same sticky header value gets the same version every time at a given weight."""
    split = Split(sticky_header="X-User")
    headers = [(b"x-user", user)]
    assert len({split.choose(headers, weight) for _ in range(5)}) == 1


@given(keys, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_raising_the_weight_never_moves_a_canary_user_back(
    user: bytes, w1: float, w2: float
) -> None:
    """Ramp steps only add canary users: canary at a weight stays canary at a higher one."""
    split = Split(sticky_cookie="session")
    headers = [(b"cookie", b"a=1; session=" + user.replace(b";", b"") + b"x")]
    lo, hi = sorted((w1, w2))
    if split.choose(headers, lo) is Version.CANARY:
        assert split.choose(headers, hi) is Version.CANARY


def test_weight_zero_sends_everyone_to_stable() -> None:
    """After a rollback (weight 0) nobody reaches the canary."""
    split = Split(rng=random.Random(1))
    assert all(split.choose([], 0.0) is Version.STABLE for _ in range(1000))


def test_the_share_matches_the_weight() -> None:
    """Over 20,000 distinct request ids, 10 % +- 1 % go to the canary."""
    split = Split()
    n = 20_000
    canary = sum(
        split.choose([(b"x-request-id", str(i).encode())], 0.1) is Version.CANARY for i in range(n)
    )
    assert abs(canary / n - 0.1) < 0.01


def test_key_order_cookie_then_header_then_request_id() -> None:
    """The sticky cookie wins over the sticky header, which wins over X-Request-Id."""
    split = Split(sticky_header="X-User", sticky_cookie="sid")
    both = [(b"x-request-id", b"r"), (b"x-user", b"u"), (b"cookie", b"sid=c")]
    assert split.key(both) == b"c:c"
    assert split.key(both[:2]) == b"h:u"
    assert split.key(both[:1]) == b"h:r"
    assert split.key([(b"cookie", b"other=1")]) is None


def test_a_request_without_key_is_random_but_seeded() -> None:
    """Keyless requests draw from the injected RNG: same seed, same assignments, both versions."""
    first, second = Split(rng=random.Random(7)), Split(rng=random.Random(7))
    a = [first.choose([], 0.5) for _ in range(50)]
    assert a == [second.choose([], 0.5) for _ in range(50)]
    assert set(a) == {Version.STABLE, Version.CANARY}

"""The split: weights, stickiness per key, monotone ramps, no canary after a rollback."""

from __future__ import annotations

import hashlib
import random

from hypothesis import given
from hypothesis import strategies as st

from ballast_asgi.canary.core.blocks import Version
from ballast_asgi.canary.core.split import Split

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
    """Over 20,000 distinct sticky values, 10 % +- 1 % go to the canary."""
    split = Split(use_request_id=True)
    n = 20_000
    canary = sum(
        split.choose([(b"x-request-id", str(i).encode())], 0.1) is Version.CANARY for i in range(n)
    )
    assert abs(canary / n - 0.1) < 0.01


def test_key_order_cookie_then_header_then_request_id() -> None:
    """The sticky cookie wins over the sticky header, which wins over X-Request-Id (opted in)."""
    split = Split(sticky_header="X-User", sticky_cookie="sid", use_request_id=True)
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


def test_request_ids_do_not_decide_the_split_by_default() -> None:
    """Without canary.sticky_request_id a client's X-Request-Id is no key (issue 27)."""
    assert Split().key([(b"x-request-id", b"r")]) is None
    assert Split(sticky_header="X-User").key([(b"x-request-id", b"r")]) is None


def _old_public_point(key: bytes) -> float:
    """The point the split used to give a key: keyed by a constant anyone could read."""
    salt = hashlib.blake2b(b"ballast-canary", digest_size=16).digest()
    digest = hashlib.blake2b(key, digest_size=8, key=salt).digest()
    return int.from_bytes(digest, "big") / float(2**64)


def test_the_point_of_a_key_is_secret() -> None:
    """A client cannot compute offline which values land on a 2 % canary (secret salt)."""
    chosen = [b"h:u%d" % i for i in range(20_000) if _old_public_point(b"h:u%d" % i) < 0.02]
    assert len(chosen) > 300
    for split in (Split(sticky_header="X-User"), Split(salt="a-deployment-secret-1")):
        on_canary = sum(split.point(k) < 0.02 for k in chosen)
        assert on_canary < 0.1 * len(chosen)  # ~2 %, as for any values


def test_gateways_sharing_a_salt_agree_and_others_do_not() -> None:
    """Same canary.salt, same point (several gateways); another salt, another split."""
    keys = [b"c:%d" % i for i in range(200)]
    one, two = Split(salt="shared-secret-0123"), Split(salt="shared-secret-0123")
    other = Split(salt="another-secret-456")
    assert [one.point(k) for k in keys] == [two.point(k) for k in keys]
    assert [one.point(k) for k in keys] != [other.point(k) for k in keys]
    assert "shared-secret" not in repr(one)


def test_a_signed_cookie_keeps_its_version_and_cannot_be_forged() -> None:
    """The gateway's cookie verifies under its salt only; an altered id or MAC is no key."""
    split = Split(signed_cookie="bv", salt="a-deployment-secret-1", rng=random.Random(3))
    ident = split.new_ident()
    value = split.sign(ident)
    assert split.key([(b"cookie", b"a=1; bv=" + value)]) == b"s:" + ident
    forged_id = b"0" * 32 + value[32:]
    forged_mac = value[:-1] + (b"0" if value[-1:] != b"0" else b"1")
    for bad in (forged_id, forged_mac, value + b"0", b"", b"x." + value):
        assert split.key([(b"cookie", b"bv=" + bad)]) is None
    assert Split(signed_cookie="bv", salt="another-secret-456").verified(value) is None

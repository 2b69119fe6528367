"""Clients against the canary (issue 27): no steering by offline ids, bounded evidence, no leak."""

from __future__ import annotations

import hashlib
import json
import random

import httpx
import pytest

from ballast_asgi.config import load_config
from ballast_asgi.config.load import ConfigError
from ballast_asgi.gateway import Gateway, build_gateway
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio
SALT = "deployment-secret-do-not-show"


def _public_point(key: bytes) -> float:
    """Where the split used to put a key: a constant salt anyone could read in the source."""
    salt = hashlib.blake2b(b"ballast-canary", digest_size=16).digest()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, key=salt).digest(), "big") / 2**64


#: Request ids computed offline to land on a 2 % canary under the old split.
CANARY_IDS = [f"id{i}" for i in range(40_000) if _public_point(f"h:id{i}".encode()) < 0.02][:200]


class Versions:
    """Both versions good: ``/boom`` fails (500) on either; each call moves the clock."""

    def __init__(self, clock: FakeClock, step: float) -> None:
        self.clock, self.step = clock, step

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.clock.advance(self.step)
        status = 500 if request.url.path == "/boom" else 200
        return httpx.Response(status, json={"version": request.url.host})


def _gateway(clock: FakeClock, step: float = 0.05, **canary: object) -> Gateway:
    section = {"upstream": "http://canary.test", "weight": 0.02, **canary}
    overrides = {"upstream": "http://stable.test", "canary": section, "breaker.enabled": False}
    config = load_config(env={}, overrides=overrides)
    return build_gateway(config, transport=httpx.MockTransport(Versions(clock, step)), env={},
                         clock=clock, rng=random.Random(11))  # fmt: skip


def _client(gw: Gateway, ip: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(gw, client=(ip, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


async def test_offline_computed_request_ids_do_not_reach_the_canary() -> None:
    """50 ids chosen offline for a 2 % canary: about 1 lands there, not 50 (was 50 of 50)."""
    clock = FakeClock()
    async with _client(_gateway(clock), "198.51.100.7") as c:
        versions = [
            (await c.get("/x", headers={"X-Request-Id": rid})).headers["x-ballast-version"]
            for rid in CANARY_IDS[:50]
        ]
    assert versions.count("canary") <= 5


async def test_failing_requests_through_chosen_ids_do_not_sink_a_good_canary() -> None:
    """500-inducing requests via canary ids for 150 simulated s: a good canary keeps running."""
    clock = FakeClock()
    gw = _gateway(clock)
    assert gw.canary is not None
    async with _client(gw, "203.0.113.5") as users, _client(gw, "198.51.100.7") as attacker:
        for i in range(3000):
            if i % 3 == 0:
                rid = CANARY_IDS[i % len(CANARY_IDS)]
                await attacker.get("/boom", headers={"X-Request-Id": rid})
            else:
                await users.get(f"/item/{i}")
        doc = (await users.get("/_ballast/canary")).json()
    assert clock.now - 1000.0 > 120.0
    assert doc["state"] == "running", doc["decision"]
    assert doc["counts"]["canary"]["errors"] < 0.1 * doc["counts"]["stable"]["errors"]


async def test_one_client_counts_at_most_its_cap_per_block() -> None:
    """A client that found canary sticky values online: 100 failures in 1 s, the judge counts 5."""
    clock = FakeClock()
    gw = _gateway(clock, step=0.001, sticky_header="X-User", max_outcomes_per_client=5)
    assert gw.canary is not None
    split = gw.canary.selector.split
    found = [f"u{i}" for i in range(5000) if split.point(f"h:u{i}".encode()) < 0.02]
    async with _client(gw, "198.51.100.7") as attacker, _client(gw, "203.0.113.5") as user:
        for i in range(100):
            r = await attacker.get("/boom", headers={"X-User": found[i % len(found)]})
            assert r.status_code == 500 and r.headers["x-ballast-version"] == "canary", r.text
        clock.advance(1.0)
        await user.get("/x")  # closes the attacker's block
        doc = (await user.get("/_ballast/canary")).json()
    assert doc["counts"]["canary"]["errors"] == 5
    assert doc["client_capped"] == 95


async def test_the_version_header_can_be_turned_off() -> None:
    """canary.version_header false: no X-Ballast-Version; the split still serves both."""
    clock = FakeClock()
    gw = _gateway(clock, version_header=False, weight=0.5)
    async with _client(gw, "203.0.113.5") as c:
        responses = [await c.get(f"/x{i}") for i in range(40)]
    assert all("x-ballast-version" not in r.headers for r in responses)
    assert {r.json()["version"] for r in responses} == {"stable.test", "canary.test"}


async def test_the_salt_is_never_shown() -> None:
    """canary.salt stays out of the snapshot, the canary document, the config repr and errors."""
    clock = FakeClock()
    gw = _gateway(clock, salt=SALT)
    async with _client(gw, "203.0.113.5") as c:
        await c.get("/x")
        shown = [(await c.get(p)).text for p in ("/_ballast/snapshot", "/_ballast/canary")]
    assert all(SALT not in text for text in shown)
    assert SALT not in repr(gw.config) and SALT not in json.dumps(gw.config.model_dump_json())
    with pytest.raises(ConfigError) as err:
        canary = {"upstream": "http://c.test", "salt": "short1"}
        load_config(env={}, overrides={"upstream": "http://s.test", "canary": canary})
    assert "canary" in str(err.value) and "16" in str(err.value) and "short1" not in str(err.value)


def test_the_salt_may_come_from_the_environment() -> None:
    """BALLAST_CANARY_SALT sets canary.salt (kept out of config files); two loads agree."""
    env = {"BALLAST_UPSTREAM": "http://s.test", "BALLAST_CANARY_SALT": SALT}
    first = load_config(env=env, overrides={"canary.upstream": "http://c.test"})
    assert first.canary.salt is not None and first.canary.salt.get_secret_value() == SALT
    assert first == load_config(env=env, overrides={"canary.upstream": "http://c.test"})


def _cookie_of(response: httpx.Response) -> str | None:
    """The signed canary cookie a response sets, as ``name=value``, or None."""
    for line in response.headers.get_list("set-cookie"):
        if line.startswith("bv="):
            return line.split(";")[0]
    return None


async def test_the_signed_cookie_keeps_a_client_on_its_version_but_cannot_choose_it() -> None:
    """canary.signed_cookie: issued once, then sticky; a forged value is ignored and replaced."""
    clock = FakeClock()
    gw = _gateway(clock, weight=0.5, signed_cookie="bv", salt=SALT)
    async with _client(gw, "203.0.113.5") as c:
        seen: dict[str, set[str]] = {}
        for _ in range(12):  # twelve users, each keeping the cookie it was given
            first = await c.get("/x", headers={"Cookie": ""})
            cookie = _cookie_of(first)
            assert cookie is not None and "HttpOnly" in first.headers["set-cookie"]
            versions = {first.headers["x-ballast-version"]}
            for _ in range(5):
                again = await c.get("/x", headers={"Cookie": cookie})
                assert _cookie_of(again) is None  # a valid cookie is not re-issued
                versions.add(again.headers["x-ballast-version"])
            seen[cookie] = versions
        kept = next(iter(seen))
        forged = kept[:-1] + ("1" if kept.endswith("0") else "0")
        replaced = await c.get("/x", headers={"Cookie": forged})
    assert all(len(v) == 1 for v in seen.values())  # each user stays on its version
    assert {v for vs in seen.values() for v in vs} == {"stable", "canary"}
    assert _cookie_of(replaced) not in (None, forged)

"""The discovery drivers against a real single-node etcd (no mocks)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from ballast_asgi.discovery.controller import Controller
from ballast_asgi.discovery.core.model import ConfigVersion, Instance, Keys, Registration
from ballast_asgi.discovery.etcd import Etcd, EtcdUnavailable
from ballast_asgi.discovery.follower import Follower
from ballast_asgi.discovery.registrar import Registrar
from tests.e2e.etcd_server import EtcdServer, etcd_server
from tests.e2e.support import HANG_S

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
_names = itertools.count()
A = Instance("http://127.0.0.1:9101", "v1")
B = Instance("http://127.0.0.1:9102", "v1")


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """One etcd for the module; each test uses its own service name."""
    with etcd_server() as server:
        yield server


@pytest.fixture
def keys() -> Keys:
    """A fresh service for each test."""
    return Keys(f"svc{next(_names)}")


async def until(cond: Callable[[], bool], seconds: float = HANG_S) -> None:
    """Wait (bounded) until ``cond()`` holds."""
    loop = asyncio.get_running_loop()
    limit = loop.time() + seconds
    while not cond():
        assert loop.time() < limit, "condition not reached in time"
        await asyncio.sleep(0.01)  # condition poll, bounded


@asynccontextmanager
async def running(*runners: Any) -> AsyncIterator[asyncio.Event]:
    """Run each ``runner.run(stop)`` until the block ends, then stop and join them."""
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(r.run(stop)) for r in runners]
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        for r in runners:  # grpc.aio needs every channel closed before the loop ends
            await r.etcd.aclose()


def controller(server: EtcdServer, keys: Keys, **kw: Any) -> Controller:
    """A controller with a short debounce on its own connection."""
    return Controller(Etcd([server.url]), keys, debounce_s=0.02, **kw)


async def current(server: EtcdServer, keys: Keys) -> ConfigVersion | None:
    """The current config version as stored."""
    client = Etcd([server.url])
    try:
        kv, _ = await client.get(keys.current)
        return ConfigVersion.decode(kv.value) if kv else None
    finally:
        await client.aclose()


async def test_registration_reaches_the_follower(etcd: EtcdServer, keys: Keys) -> None:
    """register -> controller writes version 1 -> the follower applies it."""
    applied: list[ConfigVersion] = []
    follower = Follower(Etcd([etcd.url]), keys, applied.append)
    reg = Registrar(Etcd([etcd.url]), keys, A, ttl_s=3)
    async with running(controller(etcd, keys), follower, reg):
        await until(lambda: bool(applied))
        assert applied[-1].number == 1 and applied[-1].instances == (A,)
        snap = follower.snapshot()
        assert snap["config_version"] == 1 and snap["instances"] == [A.to_json()]
        assert snap["etcd"]["connected"] and snap["applied_at"] is not None


async def test_a_lost_lease_re_registers_and_writes_no_version(
    etcd: EtcdServer, keys: Keys
) -> None:
    """Revoking the instance's lease: same key and value come back, no version N+1."""
    ctl = controller(etcd, keys)
    reg = Registrar(Etcd([etcd.url]), keys, A, ttl_s=3)
    admin = Etcd([etcd.url])
    async with running(ctl, reg):
        await until(lambda: ctl.written == 1)
        lease = reg.core.lease_id
        assert lease is not None
        await admin.revoke(lease)
        await until(lambda: reg.core.lost == 1 and reg.core.state == "registered")
        assert reg.core.lease_id != lease
        kv, _ = await admin.get(keys.instance(A.url))
        assert kv is not None and Registration.decode(kv.value) == Registration(A)
        await until(lambda: ctl.last_written is not None)
    assert ctl.written == 1
    version = await current(etcd, keys)
    assert version is not None and version.number == 1
    await admin.aclose()


async def test_deregistration_removes_the_instance_at_once(etcd: EtcdServer, keys: Keys) -> None:
    """A registrar that stops marks itself leaving: the next version drops it without grace."""
    ctl = controller(etcd, keys, removal_grace_s=60.0)
    stop_a = asyncio.Event()
    reg_a = Registrar(Etcd([etcd.url]), keys, A, ttl_s=3)
    async with running(ctl, Registrar(Etcd([etcd.url]), keys, B, ttl_s=3)):
        task = asyncio.ensure_future(reg_a.run(stop_a))
        await until(lambda: ctl.last_written is not None and len(ctl.last_written.instances) == 2)
        stop_a.set()
        await asyncio.wait_for(task, 5)
        await reg_a.etcd.aclose()
        await until(lambda: ctl.last_written is not None and ctl.last_written.instances == (B,))
    kv, _ = await (admin := Etcd([etcd.url])).get(keys.instance(A.url))
    assert kv is None
    await admin.aclose()


async def test_two_controllers_elect_one_and_never_fork(etcd: EtcdServer, keys: Keys) -> None:
    """Two controllers: one leader writes; after it stops the other takes over at N+1."""
    first, second = controller(etcd, keys), controller(etcd, keys)
    stop_first = asyncio.Event()
    t1 = asyncio.ensure_future(first.run(stop_first))
    async with running(second, Registrar(Etcd([etcd.url]), keys, A, ttl_s=3)):
        await until(lambda: first.is_leader or second.is_leader)
        leader, other = (first, second) if first.is_leader else (second, first)
        await until(lambda: leader.written == 1)
        assert not other.is_leader and other.written == 0
        if leader is first:
            stop_first.set()
            await asyncio.wait_for(t1, 5)
            await until(lambda: second.is_leader)
        async with running(Registrar(Etcd([etcd.url]), keys, B, ttl_s=3)):
            await until(lambda: (first.written + second.written) == 2)
        version = await current(etcd, keys)
        assert version is not None and version.number == 2 and version.instances == (A, B)
    stop_first.set()
    await asyncio.wait_for(t1, 5)
    await first.etcd.aclose()
    client = Etcd([etcd.url])
    history, _ = await client.get_prefix(keys.history(0)[:-12])
    assert [ConfigVersion.decode(kv.value).number for kv in history][:2] == [1, 2]
    await client.aclose()


async def test_the_swap_refuses_a_stale_revision(etcd: EtcdServer, keys: Keys) -> None:
    """Compare-and-swap on mod_revision: two writers from the same read, only one wins."""
    client = Etcd([etcd.url])
    v1 = ConfigVersion(1, (A,)).encode()
    assert await client.swap(keys.current, 0, [(keys.current, v1)])
    assert not await client.swap(keys.current, 0, [(keys.current, v1)])
    kv, _ = await client.get(keys.current)
    assert kv is not None
    results = await asyncio.gather(
        *(client.swap(keys.current, kv.mod_revision, [(keys.current, v1)]) for _ in range(5))
    )
    assert sorted(results) == [False, False, False, False, True]
    await client.aclose()


async def test_unreachable_etcd_raises_one_error() -> None:
    """Every client failure surfaces as EtcdUnavailable."""
    from tests.e2e.support import free_port

    client = Etcd([f"http://127.0.0.1:{free_port()}"], timeout_s=0.5)
    with pytest.raises(EtcdUnavailable):
        await client.get(b"/x")
    with pytest.raises(EtcdUnavailable):
        await client.grant(5)
    await client.aclose()


async def test_follower_keeps_the_last_version_while_etcd_is_down_and_catches_up(
    keys: Keys,
) -> None:
    """etcd stopped: the follower keeps version 1; restarted: it applies what came since."""
    applied: list[ConfigVersion] = []
    with etcd_server() as server:
        follower = Follower(Etcd([server.url]), keys, applied.append)
        reg_a = Registrar(Etcd([server.url]), keys, A, ttl_s=5)
        async with running(follower, controller(server, keys), reg_a):
            await until(lambda: bool(applied))
            server.stop()
            await until(lambda: not follower.connected)
            assert follower.snapshot()["config_version"] == 1
            server.start()
            await until(lambda: follower.connected)
            async with running(Registrar(Etcd([server.url]), keys, B, ttl_s=5)):
                await until(lambda: applied[-1].instances == (A, B))
    assert [v.number for v in applied] == [1, 2]
    assert follower.errors >= 1


async def test_follower_skips_bad_and_empty_versions(etcd: EtcdServer, keys: Keys) -> None:
    """A malformed value or an empty list is counted and the last good version stays."""
    applied: list[ConfigVersion] = []
    follower = Follower(Etcd([etcd.url]), keys, applied.append)
    assert follower.offer(ConfigVersion(1, (A,)).encode())
    assert not follower.offer(b"{not json")
    assert not follower.offer(ConfigVersion(2, ()).encode())
    assert not follower.offer(ConfigVersion(1, (A,)).encode())
    assert [v.number for v in applied] == [1] and follower.rejected == 2
    assert "no instance" in (follower.last_error or "")
    await follower.etcd.aclose()

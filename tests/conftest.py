"""Shared fixtures: anyio on asyncio only; no permit left in flight; no CPU pinning left."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio (the gateway's loop)."""
    return "asyncio"


@pytest.fixture(autouse=True)
def no_permits_left_in_flight() -> Iterator[None]:
    """After every test, no limiter created during it still holds a permit."""
    from ballast_asgi.core.limiter import live_limiters

    before = max((lim.serial for lim in live_limiters()), default=0)
    yield
    leaked = [
        (lim.serial, lim.inflight)
        for lim in live_limiters()
        if lim.serial > before and lim.inflight != 0
    ]
    assert not leaked, f"limiters left with permits in flight (serial, inflight): {leaked}"


@pytest.fixture(autouse=True)
def scheduling_left_as_found() -> Iterator[None]:
    """After every test, this process's CPU affinity and nice are as before it.

    An experiment's ``main`` run in-process pins itself to one CPU (and may
    renice itself); left so, every later test, and every server it starts,
    would share that one CPU (``experiments._harness.cpu.scheduling_kept``).
    The autogroup's nice is not compared: it belongs to the whole session, and
    another process of the session (a second run from the same shell) may set it.
    """
    from experiments._harness.cpu import scheduling

    before = scheduling()[:2]
    yield
    assert scheduling()[:2] == before, "a test left this process pinned or reniced"


@pytest.fixture(autouse=True)
def ports_released() -> Iterator[None]:
    """After every test, the ports ``free_port`` reserved for it are free again."""
    yield
    from tests.e2e.support import release_ports

    release_ports()

"""The stages' side-effect-free twins used by the shed at the wire agree with the real calls."""

from __future__ import annotations

import pytest

from ballast_asgi.core.capacity import Capacity
from ballast_asgi.core.limit import make_limit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.queue import PriorityQueue, Waiter
from ballast_asgi.core.routes import RouteTable
from ballast_asgi.server.wire import shed_bytes


@pytest.mark.parametrize("priority", list(Priority))
def test_capacity_would_refuse_is_try_enter_without_taking(priority: Priority) -> None:
    """At every fill level ``would_refuse`` predicts ``try_enter`` and changes nothing."""
    cap = Capacity(10, max_buffered_bytes=1024, reserved_fraction=0.2)
    for _ in range(12):
        held, refused = cap.held, cap.refused
        predicted = cap.would_refuse(priority)
        assert (cap.held, cap.refused) == (held, refused)
        assert cap.try_enter(priority) is not predicted


@pytest.mark.parametrize("priority", list(Priority))
def test_queue_would_refuse_is_push_refusing(priority: Priority) -> None:
    """Filled with each tier in turn: ``would_refuse`` is exactly ``push`` not accepting."""
    for filler in Priority:
        queue = PriorityQueue(max_size=3, reserved_fraction=0.34)
        for _ in range(4):
            total = queue.total
            predicted = queue.would_refuse(filler)
            assert queue.total == total
            assert queue.push(Waiter(filler, 0.0)).accepted is not predicted
        predicted = queue.would_refuse(priority)
        assert queue.push(Waiter(priority, 0.0)).accepted is not predicted


def test_limiter_full_predicts_try_acquire_with_and_without_partitions() -> None:
    """Unpartitioned and per route: ``full`` is ``try_acquire`` refusing, nothing created."""
    plain = Limiter(make_limit("fixed", limit=2))
    for _ in range(3):
        predicted = plain.full(0.0)
        assert (plain.try_acquire(0.0) is None) is predicted

    def fixed(quiet: bool) -> object:
        return make_limit("fixed", limit=1)

    parted = Limiter(make_limit("fixed", limit=1), partition=fixed, max_limit=3)  # type: ignore[arg-type]
    held = []
    for route in ("/a", "/a", "/b", "/c", "/d"):
        predicted = parted.full(1.0, route)
        permit = parted.try_acquire(1.0, route)
        assert (permit is None) is predicted, route
        if permit is not None:
            held.append(permit)
    for permit in held:
        permit.release(Outcome.IGNORED, 2.0)


def test_route_find_does_not_count_and_count_does() -> None:
    """``find`` returns what ``match`` would, uncounted; ``count`` counts it."""
    table = RouteTable()
    route = table.find("GET", "/users/1")
    assert table.counts.get(route.name, 0) == 0
    table.count(route)
    assert table.match("GET", "/users/1") is route and table.counts[route.name] == 2


def test_shed_bytes_frame_like_uvicorn() -> None:
    """Default headers first, connection: close unless kept alive or said, no body for HEAD."""
    headers = ((b"content-length", b"2"),)
    kept = shed_bytes(429, headers, b"{}", keep_alive=True, head=False)
    assert kept == b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\n\r\n{}"
    closing = shed_bytes(
        503, headers, b"{}", keep_alive=False, head=True, default_headers=((b"server", b"x"),)
    )
    assert closing == (
        b"HTTP/1.1 503 Service Unavailable\r\nserver: x\r\ncontent-length: 2\r\n"
        b"connection: close\r\n\r\n"
    )
    said = shed_bytes(429, ((b"Connection", b"Close"),), b"", keep_alive=False, head=False)
    assert said.count(b"onnection") == 1

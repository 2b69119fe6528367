"""Small asyncio helpers shared by the discovery drivers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


async def wait_any(events: list[asyncio.Event], timeout_s: float | None) -> None:
    """Return when one of ``events`` is set or ``timeout_s`` has passed (``None``: no limit)."""
    if any(e.is_set() for e in events):
        return
    if timeout_s is not None and timeout_s <= 0:
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


def spawn(coro: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]]) -> asyncio.Task[None]:
    """Start ``coro`` as a task kept in ``tasks`` until it ends."""
    task = asyncio.ensure_future(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def cancel_all(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel every task in ``tasks`` and wait for them."""
    for task in list(tasks):
        task.cancel()
    for task in list(tasks):
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def until_stopped(coro: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Run ``coro`` until it ends (its exception propagates) or ``stop`` is set (cancelled)."""
    task = asyncio.ensure_future(coro)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if not task.cancelled():
        task.result()

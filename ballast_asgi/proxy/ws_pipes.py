"""What a websocket relay is built of: the bytes it holds, its pipes, its closes.

``Held`` counts the bytes one connection holds against ``buffer_bytes`` and
the shared budgets (``ByteBudget``): a reader waits on its ``room``, a writer
gives bytes back as it hands them on. ``Pipe`` is one direction's queue of pending
messages, ended by a ``Close``. ``End`` is how a relay ended (its label and
the close each side still gets; ``ABORT``: drop the upstream's connection
without a handshake). ``sendable`` maps a close code received to one that may
go in a close frame. The relay itself is ``ws_relay.py``.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

from ballast_asgi.core.capacity import ByteBudget

__all__ = ["ABORT", "Close", "Data", "End", "Held", "Pipe", "message_size", "sendable"]

#: Close codes an endpoint may not put in a close frame.
_UNSENDABLE = frozenset({1004, 1005, 1006, 1015})
Data = str | bytes


def sendable(code: int, *, vanished: int) -> int:
    """A close code that may go in a close frame (1005 -> 1000; 1006/1015 -> ``vanished``)."""
    if code == 1005:
        return 1000
    if code in _UNSENDABLE or not (1000 <= code <= 1014 or 3000 <= code <= 4999):
        return vanished
    return code


@dataclass(frozen=True, slots=True)
class Close:
    """A side closed: what the other side should get once the pending messages are out."""

    code: int
    reason: str


#: The upstream's connection is dropped without a closing handshake.
ABORT = Close(0, "abort")


@dataclass(frozen=True, slots=True)
class End:
    """How the relay ended: its label and the close each side still gets (None: nothing)."""

    label: str
    client: Close | None
    upstream: Close | None


class Held:
    """The bytes one connection holds, against ``buffer_bytes`` and the shared budgets."""

    def __init__(self, limit: int, budgets: tuple[ByteBudget, ...]) -> None:
        self.limit = limit
        self.budgets = budgets
        self.used = 0
        self.room = asyncio.Event()
        self.room.set()

    def reserve(self, n: int) -> bool:
        """Count ``n`` more bytes; False (nothing counted) when a shared budget is full."""
        for i, budget in enumerate(self.budgets):
            if not budget.try_reserve(n):
                for taken in self.budgets[:i]:
                    taken.release(n)
                return False
        self.used += n
        if self.used >= self.limit:
            self.room.clear()
        return True

    def release(self, n: int) -> None:
        """Give back ``n`` bytes a writer handed on."""
        n = min(n, self.used)
        self.used -= n
        for budget in self.budgets:
            budget.release(n)
        if self.used < self.limit:
            self.room.set()

    def release_all(self) -> None:
        """Give back everything still held (the relay ended)."""
        self.release(self.used)


class Pipe:
    """One direction's pending messages (and, last, the close that ends it)."""

    def __init__(self) -> None:
        self.items: collections.deque[Data | Close] = collections.deque()
        self.ready = asyncio.Event()

    def put(self, item: Data | Close) -> None:
        self.items.append(item)
        self.ready.set()

    async def get(self) -> Data | Close:
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        return self.items.popleft()


def message_size(data: Data) -> int:
    """Bytes counted for a message (characters for text: no encoding on the hot path)."""
    return len(data)

"""Joined writes: one socket write per small response instead of two (issue 18, hot path).

uvicorn writes the status line and headers when the app sends
``http.response.start`` and the body when it sends ``http.response.body``:
two socket writes for every small response (a shed, a proxied 1 KB body).
``JoinedWrites`` stands in front of the connection's transport and keeps what
was written until the response completes, the loop turns (``call_soon``),
64 KiB are pending, or anything else touches the transport, and then writes
it at once, in order.

The guarded protocol's own request cycle (``ResponseCycle``, ``cycle.py``)
joins its writes itself, by the same rules, without this wrapper in front of
the transport (issue 31: a call less per write); ``JoinedWrites`` stays for
a transport that is written to from outside such a cycle, and ``_JOIN_LIMIT``
is the one limit both use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

#: Pending response bytes written at once without waiting for the loop to turn.
_JOIN_LIMIT = 64 * 1024


class JoinedWrites:
    """A connection transport for the request cycle: writes joined until flushed.

    ``flush`` runs when the response completes (the protocol calls it), on the
    next loop iteration (scheduled by the first pending write, so a streamed
    head or chunk is never held back), once ``_JOIN_LIMIT`` bytes are pending
    (uvicorn's write flow control then sees them), and before anything else is
    done with the transport (close, ``is_closing`` is read-only and passes through).
    """

    __slots__ = ("_loop", "_pending", "_scheduled", "_size", "on_close", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        on_close: Callable[[], bool] | None = None,
    ) -> None:
        self.transport = transport
        #: Called by ``close``; True when it took over the closing (a lingering close).
        self.on_close = on_close
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        """Keep ``data``; the first pending write schedules a flush on the next loop turn."""
        self._pending.append(data)
        self._size += len(data)
        if self._size >= _JOIN_LIMIT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._scheduled = False
        if self._pending:
            self.flush()

    def flush(self) -> None:
        """Write everything pending in one ``transport.write`` (dropped once closing)."""
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        self._pending = []
        self._size = 0
        if not self.transport.is_closing():
            self.transport.write(data)

    def is_closing(self) -> bool:
        """Whether the connection is closing (nothing pending is lost by asking)."""
        return self.transport.is_closing()

    def close(self) -> None:
        """Flush, then close the connection (or let ``on_close`` close it lingering)."""
        self.flush()
        if self.on_close is None or not self.on_close():
            self.transport.close()

    def __getattr__(self, name: str) -> Any:
        self.flush()
        return getattr(self.transport, name)

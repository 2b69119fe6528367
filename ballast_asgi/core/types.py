"""ASGI type aliases and the clock type shared by every stage."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Monotonic seconds. Cores take ``now`` as an argument; adapters take a clock.
Clock = Callable[[], float]

#: Raw ASGI header list.
RawHeaders = list[tuple[bytes, bytes]]

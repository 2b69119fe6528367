"""A response body bounded by the call's deadline (httpx's read timeout is per read).

``BoundedStream`` wraps the body of a response that arrived with budget
left: each chunk must arrive before the call's deadline, else the read
raises ``DeadlineExceeded(sent=True)``. A downstream dripping its body a
byte at a time cannot hold the caller past its budget.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx

from ballast_asgi.client.errors import DeadlineExceeded
from ballast_asgi.core.types import Clock


class BoundedStream(httpx.AsyncByteStream):
    """``inner``'s chunks, each awaited no later than ``deadline`` on ``clock``."""

    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        *,
        deadline: float,
        clock: Clock,
        request: httpx.Request,
        host: str,
    ) -> None:
        self._inner = inner
        self._deadline = deadline
        self._clock = clock
        self._request = request
        self._host = host

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        while True:
            try:
                with anyio.fail_after(max(0.0, self._deadline - self._clock())):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise DeadlineExceeded(
                    f"{self._host}: the response body did not arrive within the call's budget",
                    request=self._request, host=self._host, remaining_ms=0.0, sent=True,
                ) from None  # fmt: skip
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()

"""What a transport's direct path returns: a response head and its body, no ``httpx.Response``.

``DirectResponse`` is shared by the aiohttp and lean transports (the proxy reads
``status_code``, ``raw_headers``, ``stream`` and ``aclose``); ``ResponseBody``
is what the proxy reads of its body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class ResponseBody(Protocol):
    """What the proxy reads of a direct response's body (``AiohttpResponseStream``'s API)."""

    def arrived(self, length: int) -> bytes | None:
        """The whole body if it came with the head, else None."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive."""

    async def aclose(self) -> None:
        """Release the connection (closed when the body was not read to its end)."""


class DirectResponse:
    """An upstream response head and its body stream, without ``httpx.Response`` around it.

    What the proxy reads of a response (``status_code``, ``raw_headers``,
    ``stream``, ``aclose``) on ``AiohttpTransport.send_direct``'s path.
    """

    __slots__ = ("_stream", "raw_headers", "status_code")
    #: The transport's parser already refused control characters in header values.
    values_checked = False

    def __init__(
        self, status: int, raw_headers: list[tuple[bytes, bytes]], stream: ResponseBody
    ) -> None:
        self.status_code = status
        self.raw_headers = raw_headers
        self._stream = stream

    @property
    def stream(self) -> ResponseBody:
        """The body (a property, so that a subclass may be its own body: compiled code
        reads an overridden property right, an attribute it does not, ADR 0021)."""
        return self._stream

    async def aclose(self) -> None:
        """Release the connection (or close it when the body was not read)."""
        await self.stream.aclose()

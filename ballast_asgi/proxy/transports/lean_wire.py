"""One exchange of the lean transport: the upstream response, parsed as it arrives.

``LeanResponse`` is the exchange in progress on one pooled connection
(``Conn``, the ``asyncio.Protocol`` in ``lean_conn.py``, hands it every
read); it parses the reads with a fresh ``httptools.HttpResponseParser`` and
is also what the proxy reads: the response head (``status_code``,
``raw_headers``) and its body stream (``arrived``, ``async for``,
``aclose``), the API of ``AiohttpResponseStream``.

Framing (llhttp decodes, the proxy re-frames): Content-Length, chunked (the
chunks' payload only; trailers dropped, as aiohttp does), close-delimited
bodies (complete at EOF; the connection is not reused), no body for HEAD and
204/304, 1xx interim responses skipped, ``101`` unasked is a protocol error,
as is a status outside 100-599 (llhttp takes ``099`` as interim and would wait),
as is a head with more than ``max_headers`` fields (counted as they are parsed:
no list of 60,000 fields is built; the proxy checks the head's rules again).
Header names and values are passed on as sent (order, repeats, case), values
without trailing whitespace, as aiohttp's ``raw_headers``.

The connection goes back to the pool only once the response was read to its
end off the socket and the upstream allows keep-alive (never after HEAD or a
close-delimited body, nor when more bytes followed the response); anything
else closes it. Failures are httpx's errors, as ``map_error`` gives them for
aiohttp: EOF before the head or mid-body and malformed or oversized responses
-> ``RemoteProtocolError``, a reset -> ``ReadError``, timeouts ->
``ReadTimeout``. Timeouts: the deadline (``total``) and the idle bound
between reads (``sock_read``, suspended while reading is paused for a slow
consumer), checked by the connection's lazy timer (``Conn.arm``: one timer
per connection, not per exchange; a check before the exchange's due time
only re-arms it). Backpressure: reading pauses while
more than ``HIGH_WATER_BYTES`` wait for the consumer.

The lane (``gateway/lane.py``) is told instead of awaiting (``notify``): at the
head, at each later read of a body it waits for, and at a failure before the head.

Longer than 320 lines on purpose: the exchange is one parser-callback object
(head, body, timers, both ways of telling its reader), kept in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from ballast_asgi.proxy.transports.direct import DirectResponse
from ballast_asgi.proxy.transports.lean_conn import Conn

#: The lane's callback: None once the final head is in, else the error before it.
Notify = Callable[["httpx.TransportError | None"], None]
#: Body bytes buffered for a slow consumer before the socket is no longer read.
HIGH_WATER_BYTES = 128 * 1024
#: Bytes received before the final response head, as a multiple of ``max_field_size``.
HEAD_FIELDS = 4
_OWS = (32, 9)  # space, tab


class LeanResponse(DirectResponse):
    """One exchange on a ``Conn``: parser callbacks, the head future and the body buffer."""

    __slots__ = (
        "_bad", "_chunks", "_complete", "_conn", "_deadline", "_error", "_fields", "_final",
        "_head_only", "_idle", "_keep", "_last", "_limit", "_loop", "_max_headers", "_parser",
        "_pending", "_read", "_released", "_size", "_waiter", "head", "notify",
    )  # fmt: skip

    def __init__(
        self,
        conn: Conn,
        head_only: bool,
        limit: int,
        deadline: float | None,
        idle: float | None,
        max_headers: int = 100,
        now: float | None = None,
        notify: Notify | None = None,
    ) -> None:
        """``now``: the loop's time when the caller has it (the idle bound starts there).

        ``notify`` (the lane's exchange, ``gateway/lane.py``): called once, with None when
        the final head has arrived (after the read that brought it was parsed: what came
        of the body with it is in), or with the error when the exchange failed before its
        head; the ``head`` future then never holds an error (nobody awaits it)."""
        loop = conn.loop
        self.status_code = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._conn, self._loop, self._head_only, self._limit = conn, loop, head_only, limit
        self._max_headers = max_headers
        self.head: asyncio.Future[None] = loop.create_future()
        #: Dropped with the connection (it holds our callbacks: no cycle left for the GC).
        self._parser: HttpResponseParser | None = HttpResponseParser(self)
        self._fields: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = self._pending = 0
        self._final = self._complete = self._keep = self._read = self._released = False
        self._bad: httpx.TransportError | None = None
        self._error: httpx.TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline, self._idle = deadline, idle
        self._last = loop.time() if now is None else now
        self.notify = notify
        conn.exchange = self
        if deadline is not None or idle is not None:
            conn.arm(self._next_check())  # the connection's lazy timer (lean_conn.py)

    #: llhttp refuses control characters in header values (the proxy need not look).
    values_checked = True

    @property
    def stream(self) -> LeanResponse:  # itself, with no self-reference
        """The body stream: this object."""
        return self

    # -- parser callbacks (never raise: failures are recorded and acted on in ``feed``) --
    def on_message_begin(self) -> None:
        if self._final:  # a second response after ours: do not reuse this connection
            self._keep = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._final:
            return  # trailers (or a response nobody asked for)
        if len(name) + len(value) > self._limit:
            self._bad = httpx.RemoteProtocolError(f"upstream header field over {self._limit} bytes")
        fields = self._fields
        if len(fields) >= self._max_headers:  # no list of 60,000 fields is built
            self._bad = httpx.RemoteProtocolError(
                f"upstream sent more than {self._max_headers} header fields"
            )
            return
        if value and value[-1] in _OWS:
            value = value.rstrip(b" \t")
        fields.append((name, value))

    def on_headers_complete(self) -> None:
        if self._final:
            return  # a response after ours changes nothing of ours
        assert self._parser is not None
        status = self._parser.get_status_code()
        if not 100 <= status <= 599:  # llhttp takes any 3 digits; 099 is not interim
            self._bad = httpx.RemoteProtocolError(f"upstream sent status {status}")
        if status < 200 or self._bad is not None:
            self._fields = []  # 1xx interim response: skipped (101 raises in feed)
            return
        self._final = True
        self.status_code = status
        self.raw_headers = self._fields
        if self._head_only:
            self._complete = True  # HEAD: no body whatever the head says; not reused
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        self._chunks.append(body)
        self._size += len(body)
        if self._waiter is not None:  # someone iterates the body (not the common small one)
            self._wake()
        if self._size > HIGH_WATER_BYTES:
            self._conn.pause(True)

    def on_message_complete(self) -> None:
        if self._final and not self._complete:
            self._complete = True
            assert self._parser is not None
            self._keep = self._parser.should_keep_alive()
            if self._waiter is not None:
                self._wake()

    # -- events from the connection ------------------------------------------
    def feed(self, data: bytes) -> None:
        """Parse one read; fail, finish or keep waiting."""
        if self._idle is not None:
            self._last = self._loop.time()
        parser = self._parser
        if parser is None:
            return
        try:
            parser.feed_data(data)
        except HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("upstream switched protocols unasked"))
            return
        except HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed upstream response: {exc}"))
            return
        if self._bad is not None:
            self._fail(self._bad)
        elif self._complete:
            self._drop(self._keep)
        elif not self._final:
            self._pending += len(data)
            if self._pending > HEAD_FIELDS * self._limit:
                self._fail(httpx.RemoteProtocolError("upstream response head too large"))
            return
        notify = self.notify
        if notify is not None and self._final and self._error is None:
            self.notify = None
            notify(None)

    def lost(self, exc: Exception | None) -> None:
        """EOF (``exc`` None) or a broken connection."""
        if self._complete:
            self._drop(False)
        elif exc is not None:
            self._fail(httpx.ReadError(str(exc) or type(exc).__name__))
        elif not self._final:
            self._fail(httpx.RemoteProtocolError("upstream closed the connection before the head"))
        elif self._close_delimited():
            self._complete = True
            self._wake()
            self._drop(False)
        else:
            self._fail(httpx.RemoteProtocolError("upstream closed the connection mid-body"))

    def _close_delimited(self) -> bool:
        for name, value in self.raw_headers:
            lower = name.lower()
            if lower == b"content-length":
                return False
            if lower == b"transfer-encoding" and value.lower().endswith(b"chunked"):
                return False
        return True

    def _fail(self, error: httpx.TransportError) -> None:
        if self._complete:  # garbage after a complete response: just not reusable
            self._drop(False)
            notify = self.notify
            if notify is not None and self._final:  # the lane's: the response is whole
                self.notify = None
                notify(None)
            return
        if self._error is None:
            self._error = error
            notify = self.notify
            if notify is not None:  # the lane's, before the head: told, after the drop
                self.notify = None
                self._drop(False)
                notify(error)
                return
            if not self.head.done():
                self.head.set_exception(error)
            self._wake()
        self._drop(False)

    def _drop(self, reuse: bool) -> None:
        """Hand the connection back (reused or closed), once."""
        if self._released:
            return
        self._released = True
        self._parser = None  # the connection's timer stays armed for its next exchange
        conn = self._conn
        conn.exchange = None
        if conn.paused:
            conn.pause(False)
        if self.status_code == 500:
            conn.rest = True  # uvicorn may be about to close it (``lean.py``, REST_S)
        conn.release(conn, reuse and not conn.closed)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- timeouts -------------------------------------------------------------
    def _next_check(self) -> float:
        idle, deadline = self._idle, self._deadline
        if idle is None:
            assert deadline is not None
            return deadline
        due = self._last + idle
        return due if deadline is None or due < deadline else deadline

    def on_timer(self) -> None:
        """The connection's timer fired during this exchange: fail it if a bound is spent."""
        if self._released:
            return
        now = self._loop.time()
        if now < self._next_check():  # armed for an earlier exchange: not due yet
            self._conn.arm(self._next_check())
        elif self._deadline is not None and now >= self._deadline:
            self._fail(httpx.ReadTimeout("upstream did not finish before the deadline"))
        elif self._idle is not None and not self._conn.paused and now - self._last >= self._idle:
            self._fail(httpx.ReadTimeout(f"no data from upstream for {self._idle:g} s"))
        else:
            if self._conn.paused:
                self._last = now  # a paused read is the consumer's wait, not the upstream's
            self._conn.arm(self._next_check())

    # -- what the proxy reads -------------------------------------------------
    @property
    def final(self) -> bool:
        """The final response head is in."""
        return self._final

    @property
    def complete(self) -> bool:
        """The response was read to its end (its body, if any, is in or was taken)."""
        return self._complete

    def arrived(self, length: int) -> bytes | None:
        """The whole body if all ``length`` bytes are already in, else None (taken once)."""
        if self._read or not self._complete or self._size != length:
            return None
        self._read = True
        chunks, self._chunks, self._size = self._chunks, [], 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def __aiter__(self) -> LeanBody:
        """The body's chunks as they arrive (read once: ``arrived`` gives nothing after)."""
        self._read = True
        return LeanBody(self)

    async def next_chunk(self) -> bytes | None:
        """The bytes in since the last call, waiting for some; None at the end of the body."""
        while True:
            chunks = self._chunks
            if chunks:
                self._chunks, self._size = [], 0
                if not self._released and self._conn.paused:  # released: someone else's
                    self._last = self._loop.time()  # the upstream's idle bound starts again
                    self._conn.pause(False)
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self._error is not None:
                raise self._error
            if self._complete:
                return None
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    async def aclose(self) -> None:
        """Close the connection unless the response was read to its end (then it is pooled)."""
        self.abort()

    def abort(self) -> None:
        """Close the connection when the response is not complete (idempotent)."""
        if not self._released:
            self._conn.close()
            self._drop(False)


class LeanBody:
    """``async for`` over a ``LeanResponse``'s body (a class, not an async generator:
    mypyc compiles this module, ADR 0021)."""

    __slots__ = ("_response",)

    def __init__(self, response: LeanResponse) -> None:
        self._response = response

    def __aiter__(self) -> LeanBody:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._response.next_chunk()
        if chunk is None:
            raise StopAsyncIteration
        return chunk


__all__ = ["HIGH_WATER_BYTES", "Conn", "LeanBody", "LeanResponse"]

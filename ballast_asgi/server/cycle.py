"""The guarded protocol's request cycle: uvicorn's, in fewer steps per request (issue 31).

uvicorn's (0.55) ``RequestResponseCycle`` costs an ``asyncio.Event``, a body
``bytearray`` and a closure per request, re-validates every header with two
regular-expression searches each, and (behind the old ``JoinedWrites``, now gone) goes
through a transport wrapper for each write. ``ResponseCycle`` is the same
cycle for ``GuardedHttpToolsProtocol`` (and so the gateway's
``WireShedProtocol``), with every guarantee of uvicorn's ``send``/``receive``
kept and the same bytes written in the same order:

* header names and values are checked against uvicorn's patterns (CR/LF
  injection), once per response over the joined names and values; when that
  finds anything (or anything in the loop raises), uvicorn's own per-header
  loop runs from the start, so the same error is raised at the same header
  with the same state;
* ``Content-Length`` accounting (longer or shorter raises), ``Transfer-Encoding:
  chunked`` (given, or added when neither is: not for HEAD, 204, 304), HEAD
  without a body, ``connection: close`` when the connection does not stay
  open (HTTP/1.0, ``Connection: close`` either way, shutdown), ``Expect:
  100-continue`` answered at the first ``receive``, write backpressure waited
  for before each message, a disconnected client's messages dropped;
* the writes of a response are joined (what the old ``JoinedWrites`` did, now in the
  cycle): kept until the response completes, the loop turns (``call_soon``),
  64 KiB are pending, or the protocol writes itself (``flush``, found as
  ``protocol._writing``), then written at once, nothing once closing; a
  closing answer closes through ``protocol._close_after_response`` (lingering
  while the request body still arrives);
* the request's ``asyncio.Event`` is made only when ``receive`` has to wait
  (a request without a body is complete before its task runs), the body buffer
  only when a body arrives.

Longer than 300 lines on purpose: it is uvicorn's whole cycle (``run_asgi``,
``send``, ``receive``, the 500) with the joined writes, kept as one class so
that each guarantee can be checked against uvicorn's code side by side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from ballast_asgi.middleware.context import LEAVING
from ballast_asgi.server.joined import _JOIN_LIMIT

if TYPE_CHECKING:
    from ballast_asgi.server.guarded import GuardedHttpToolsProtocol

#: Response header names that change the framing (uvicorn's ``send`` looks at these).
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_NO_BODY = (204, 304)
_FIELD = b": ".join


#: uvicorn's 500 (plain text, ``connection: close``), as its two messages.
_500 = (
    {
        "type": "http.response.start",
        "status": 500,
        "headers": [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"21"),
            (b"connection", b"close"),
        ],
    },
    {"type": "http.response.body", "body": b"Internal Server Error", "more_body": False},
)


def _noop() -> None:
    """What ``on_response`` becomes once the app returned (uvicorn's ``lambda: None``)."""


class ResponseCycle:
    """One request's ASGI ``receive``/``send`` (uvicorn's ``RequestResponseCycle``, leaner)."""

    __slots__ = (
        "_pending",
        "_scheduled",
        "_set",
        "_size",
        "body",
        "chunked_encoding",
        "disconnected",
        "expected_content_length",
        "flow",
        "keep_alive",
        "message_event",
        "more_body",
        "on_gone",
        "on_response",
        "protocol",
        "response_complete",
        "response_started",
        "scope",
        "stopped",
        "task",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        protocol: GuardedHttpToolsProtocol,
        scope: Any,
        keep_alive: bool,
        expect_100_continue: bool,
    ) -> None:
        self.protocol = protocol
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.on_response = protocol.on_response_complete
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        #: The request body not received yet (None: none arrived since the last ``receive``).
        self.body: bytearray | None = None
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        #: uvicorn's event, made by the first ``receive`` that has to wait; ``_set`` before.
        self.message_event: asyncio.Event | None = None
        self._set = False
        #: Response bytes joined and not written yet, their size, a flush on the next turn.
        self._pending: list[bytes] | None = None
        self._size = 0
        self._scheduled = False
        #: Called once when the client leaves before the response is complete (the lane's
        #: exchange, or the proxy's upstream wait: ``stop``); the ASGI task running the
        #: request (``_start_asgi_task``), and whether ``stop`` cancelled it.
        self.on_gone: Callable[[], None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.stopped = False

    def wake(self) -> None:
        """uvicorn's ``message_event.set()``: something for ``receive`` happened."""
        event = self.message_event
        if event is None:
            self._set = True
        else:
            event.set()

    # The joined writes.
    def _write(self, data: bytes) -> None:
        """Keep ``data``: written at the limit (``_JOIN_LIMIT``) or on the next loop turn."""
        pending = self._pending
        if pending is None:
            self._pending = [data]
            self._size = len(data)
            self.protocol._writing = self
        else:
            pending.append(data)
            self._size += len(data)
        if self._size >= _JOIN_LIMIT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self.protocol.loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._scheduled = False
        if self._pending:
            self.flush()

    def flush(self) -> None:
        """Write everything pending in one ``transport.write`` (dropped once closing)."""
        pending = self._pending
        if not pending:
            return
        self._pending = None
        self._size = 0
        protocol = self.protocol
        if protocol._writing is self:
            protocol._writing = None
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        transport = self.transport
        if not transport.is_closing():
            transport.write(data)

    def _close(self) -> None:
        """uvicorn's ``transport.close()``: flush, then close (lingering while a body arrives)."""
        self.flush()
        if not self.protocol._close_after_response():
            self.transport.close()

    # ASGI exception wrapper
    def left(self) -> None:
        """The client left before the response was complete (``connection_lost``)."""
        self.disconnected = True
        hook = self.on_gone
        if hook is not None:
            self.on_gone = None
            hook()

    def stop(self) -> None:
        """Cancel the request's task where it waits for the upstream (the proxy registers
        this as ``on_gone`` for that wait only, and takes the cancellation back there)."""
        task = self.task
        if task is not None and not task.done():
            self.stopped = True
            task.cancel()

    def took_back(self) -> bool:
        """At a ``CancelledError``: whether it was ``stop``'s (the client left), and if so
        take it back (the task goes on to record and release); False: someone else's."""
        if not self.stopped or self.task is None:
            return False
        self.stopped = False
        self.task.uncancel()
        return True

    async def run_asgi(self, app: Any) -> None:
        """uvicorn's ``run_asgi``: the app, a 500 when it failed before its response."""
        LEAVING.set(self)  # in this task's own context
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:  # no await in here: compiled, ADR 0021
            self.fail(exc)
        else:
            if result is not None:
                msg = "ASGI callable should return None, but returned '%s'."
                self.protocol.logger.error(msg, result)
                self._close()
            elif not self.response_started and not self.disconnected:
                self.protocol.logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                self.protocol.logger.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self.on_response = _noop
            self.on_gone = self.task = None  # no cycle through the task's frames

    def fail(self, exc: BaseException) -> None:
        """``run_asgi``'s answer to an app that raised, without waiting (the lane's): logged,
        uvicorn's 500 when nothing was sent yet, else the connection closed."""
        self.protocol.logger.error("Exception in ASGI application\n", exc_info=exc)
        if not self.response_started:
            for message in _500:
                self.deliver(message)
        else:
            self._close()

    async def send_500_response(self) -> None:
        """uvicorn's 500 (plain text, ``connection: close``)."""
        for message in _500:
            await self.send(message)

    # ASGI interface
    async def send(self, message: Any) -> None:
        """uvicorn's ``send``: the same checks, the same bytes, joined."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        self.deliver(message)

    def start(self, app: Any) -> None:
        """Run ``app`` for this cycle's request as an ASGI task (uvicorn's way): the lane
        (``gateway/lane.py``) hands a request it began to the ASGI path with this."""
        self.protocol._start_asgi_task(self, app)

    def deliver(self, message: Any) -> None:
        """``send`` once the transport takes writes: the message's bytes, now (joined).

        The lane calls it directly, only while ``flow.write_paused`` is false (else it
        hands the request to the ASGI path, whose ``send`` waits)."""
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
                )
            self.response_started = True
            self.waiting_for_100_continue = False
            self._pend_head(self._head(message))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.body', but got '{message['type']}'."
                )
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            elif self.chunked_encoding:
                content = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
                if not more_body:
                    content.append(b"0\r\n\r\n")
                self._write(b"".join(content))
            else:
                num_bytes = len(body)
                if num_bytes > self.expected_content_length:
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= num_bytes
                pending = self._pending
                if more_body or pending is None or self._size + num_bytes >= _JOIN_LIMIT:
                    self._write(body)
                else:  # the common last message: joined to the held head, written below
                    pending.append(body)
                    self._size += num_bytes
            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                event = self.message_event  # ``wake`` inlined
                if event is None:
                    self._set = True
                else:
                    event.set()
                if self.keep_alive:
                    self.flush()
                else:
                    self._close()
                self.on_response()
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, "
                "after response already completed."
            )

    def _pend_head(self, data: bytes) -> None:
        """``_write`` of the head, inlined: the cycle's first joined write."""
        self._pending = [data]
        self._size = len(data)
        protocol = self.protocol
        protocol._writing = self
        if len(data) >= _JOIN_LIMIT:
            self.flush()
        else:
            self._scheduled = True
            protocol.loop.call_soon(self._flush_soon)

    def deliver_whole(self, status: int, headers: Any, body: bytes) -> None:
        """``deliver`` of a response head and its whole body (one last body message), as
        one write when the connection stays open: the lane's answer (``gateway/lane.py``).

        The same bytes, checks and state as the two messages through ``deliver``; a
        response that is not the plain case (HEAD, chunked, a body that is not the head's
        Content-Length, a connection that closes after it) goes through ``deliver``."""
        if self.disconnected or self.response_started:
            self.deliver({"type": "http.response.start", "status": status, "headers": headers})
            self.deliver({"type": "http.response.body", "body": body, "more_body": False})
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        head = self._head({"type": "http.response.start", "status": status, "headers": headers})
        if (
            not self.keep_alive
            or self.chunked_encoding
            or self.expected_content_length != len(body)
            or self.scope["method"] == "HEAD"
        ):
            self._pend_head(head)
            self.deliver({"type": "http.response.body", "body": body, "more_body": False})
            return
        self.expected_content_length = 0
        self.response_complete = True
        self.wake()
        transport = self.transport
        if not transport.is_closing():
            transport.write(head + body)  # what ``flush`` writes of the two joined messages
        self.on_response()

    def deliver_relayed(self, status: int, headers: Any, body: bytes) -> None:
        """``deliver_whole`` of a head the lane relays from the lean client: names lower-case
        and values already checked by llhttp and ``response_head`` (no CR, LF or other
        control character, names that are tokens), one ``content-length`` of ``len(body)``
        and no ``connection`` or ``transfer-encoding``. For such a head uvicorn's header
        loop finds nothing to do but join them; this joins them (the same bytes, tested).
        Anything else (a server that adds headers or logs each response, a connection that
        closes, HEAD) goes through ``deliver_whole``."""
        protocol = self.protocol
        if (
            self.disconnected
            or self.response_started
            or not self.keep_alive
            or protocol.access_log
            or protocol.server_state.default_headers
            or self.scope["method"] == "HEAD"
            or not headers
        ):
            self.deliver_whole(status, headers, body)
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        self.chunked_encoding = False
        self.expected_content_length = 0
        self.response_complete = True
        self.wake()
        transport = self.transport
        if not transport.is_closing():
            fields = b"\r\n".join(map(_FIELD, headers))
            transport.write(b"".join((STATUS_LINE[status], fields, b"\r\n\r\n", body)))
        self.on_response()

    def _head(self, message: Any) -> bytes:
        """The status line and headers of ``http.response.start`` (uvicorn's loop, fused)."""
        status_code = message["status"]
        protocol = self.protocol
        headers = message.get("headers", [])
        defaults = protocol.server_state.default_headers
        if defaults:
            headers = [*defaults, *headers]
        elif type(headers) is not list:  # uvicorn lists them (read twice on an error here)
            headers = list(headers)
        scope = self.scope
        if protocol.access_log:
            protocol.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),
                scope["method"],
                get_path_with_query_string(scope),
                scope["http_version"],
                status_code,
            )
        content = [STATUS_LINE[status_code]]
        keep_alive = self.keep_alive
        chunked = self.chunked_encoding
        expected = self.expected_content_length
        has_connection_close = False
        try:
            for name, value in headers:
                name = name.lower()
                if name in _FRAMING:
                    if name == b"content-length":
                        if chunked is None:
                            expected = int(value.decode())
                            chunked = False
                    elif name == b"transfer-encoding":
                        if value.lower() == b"chunked":
                            expected = 0
                            chunked = True
                    elif b"close" in [token.lower().strip() for token in value.split(b",")]:
                        keep_alive = False
                        has_connection_close = True
                content += (name, b": ", value, b"\r\n")
            # uvicorn's patterns are one character class each: a match in a join is a match
            # in one header (lowercasing changes no character they look for).
            if HEADER_RE.search(b"".join(content[1::4])) or HEADER_VALUE_RE.search(
                b"".join(content[3::4])
            ):
                raise RuntimeError("Invalid HTTP header name or value.")
        except Exception:  # uvicorn's own loop, header by header, raises what it raises
            self._checked_head(headers)
            raise
        self.keep_alive = keep_alive
        self.expected_content_length = expected
        if not keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if chunked is None and scope["method"] != "HEAD" and status_code not in _NO_BODY:
            chunked = True
            content.append(b"transfer-encoding: chunked\r\n")
        self.chunked_encoding = chunked
        content.append(b"\r\n")
        return b"".join(content)

    def _checked_head(self, headers: Any) -> None:
        """uvicorn's own header loop on this cycle's state: raises where it raises."""
        for name, value in headers:
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False

    async def receive(self) -> Any:
        """uvicorn's ``receive``: 100-continue, then the body so far or a disconnect."""
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            flow = self.flow
            if flow.read_paused:
                flow.resume_reading()
            if self._set:  # it happened already: uvicorn's wait returns at once, then clears
                self._set = False
            else:
                event = self.message_event
                if event is None:
                    event = self.message_event = asyncio.Event()
                await event.wait()
                event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = self.body
        if body is None:
            data = b""
        else:
            data = bytes(body)
            self.body = None
        return {"type": "http.request", "body": data, "more_body": self.more_body}


__all__ = ["ResponseCycle"]

"""Shed at the wire: answer a request the stages would shed from its parsed head (issue 31).

``WireShedProtocol`` is the guarded httptools protocol (``GuardedHttpToolsProtocol``:
head timeout, head size cap, joined writes, lingering close) plus one step: when
a request head is complete it asks the app ``shed_at_wire(...)``
(``Gateway.shed_at_wire`` -> ``Pipeline.decide_at_wire`` ->
``middleware/at_wire.py``: the stages' own decisions, read with the one framing
parser ``core.head.read_head``) whether the request would be shed now. If so the
shed response is written to the transport as bytes (built once per status,
reason, tier, Retry-After, keep-alive and HEAD, then reused), before an ASGI
scope, a request cycle, a ``RequestContext`` or any coroutine exists. Its bytes
are what uvicorn writes for the ASGI path's shed (the same headers from
``ShedResponder.response``, the server's default headers, ``connection: close``
when the connection does not stay open, no body for HEAD) and it is counted the
same way (``ballast_requests_total``, ``ballast_shed_total``, the route, the
stage's own counters, uvicorn's request count). Anything else goes the
ordinary way, unchanged.

Framing is what uvicorn does after an ASGI shed:

* keep-alive: the connection stays open; a body that follows the shed head is
  read by the parser and dropped (its length is the parser's, from the same
  ``Content-Length``/chunked framing), and the next request is parsed after it;
* HTTP/1.0 or ``Connection: close``: ``connection: close`` is sent and the
  connection closed once the request's body has been read, or at once with a
  lingering close (FIN, then read and drop) when the body is still arriving.
  Whatever the client pipelined after such a request is never answered.

It decides at the wire only when that cannot reorder or unbound anything: no
response of this connection is in progress or queued (pipelining), the
transport is not paused for writing (a client that does not read gets uvicorn's
backpressure), uvicorn's ``limit_concurrency`` is not reached (its 503 comes
first), no protocol switch, uvicorn's access log is off (it logs each ASGI
response). The gateway decides only in its plain form (no access log, no
discovery wrapper, not the admin prefix, not dry-run: see ``Gateway.shed_at_wire``).

Turned off with ``server.shed_at_wire: false`` (the ``ballast`` CLI and
``uvicorn ballast_asgi.gateway:app`` then install the guarded protocol alone);
``uvicorn ballast_asgi.gateway:app --http ballast_asgi.server.wire:WireShedProtocol``
names it explicitly (default limits), ``--http httptools`` does not turn it off
(uvicorn's own class is replaced by the gateway's when adopted).

Longer than 300 lines on purpose: the shed path is one class with uvicorn's and
the guarded protocol's per-request steps (``data_received``, ``on_header``, the
head timing, the write) inlined, each a Python call less per request; a shed
costs about 35 us, a call about 0.1 (issue 31 item 1, docs/bench.md).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.shed import Shed, ShedHeaders
from ballast_asgi.server.serve import _TIMER_SLACK_S, GuardedHttpToolsProtocol

#: What ``Gateway.shed_at_wire`` returns: the shed, status, Retry-After seconds, headers, body.
Answer = tuple[Shed, int, int, ShedHeaders, bytes]
AtWire = Callable[
    [str, str, bytes, list[tuple[bytes, bytes]], "str | None", str, list[object]], "Answer | None"
]

#: Shed responses kept as bytes (statuses x reasons x tiers x Retry-After x 4 variants; bounded).
_WIRE_MAX = 4096
_WIRE: dict[tuple[int, ShedReason, Priority, int, bool, bool], bytes] = {}


def shed_bytes(
    status: int,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    *,
    keep_alive: bool,
    head: bool,
    default_headers: Sequence[tuple[bytes, bytes]] = (),
) -> bytes:
    """The bytes uvicorn's ``RequestResponseCycle.send`` writes for this response
    (status line, default then response headers, ``connection: close`` unless kept
    alive or already said, the body unless HEAD)."""
    content = [STATUS_LINE[status]]
    has_close = False
    for name, value in (*default_headers, *headers):
        name = name.lower()
        if name == b"connection":
            has_close = has_close or b"close" in [t.lower().strip() for t in value.split(b",")]
        content.extend((name, b": ", value, b"\r\n"))
    if not keep_alive and not has_close:
        content.append(b"connection: close\r\n")
    content.append(b"\r\n")
    if not head:
        content.append(body)
    return b"".join(content)


class WireShedProtocol(GuardedHttpToolsProtocol):
    """The guarded protocol that answers a shed from the parsed head (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The app's decision at the wire (None: an app without one; plain guarded protocol).
        self._at_wire: AtWire | None = getattr(self.app, "shed_at_wire", None)
        #: The request being parsed was answered here (or is dropped): its body is not kept.
        self._shed_here = False
        #: Its answer closes the connection once its body was read.
        self._close_when_read = False
        #: The connection is closing after such an answer: later requests are dropped.
        self._dropping = False
        #: Keep-alive after an answer written here: idle since (loop time), and the timer.
        self._idle_since: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    def on_headers_complete(self) -> None:
        at_wire = self._at_wire
        if at_wire is not None and (self._dropping or self._answer_at_wire(at_wire)):
            # Answered (or, after a closing answer, never answered, as uvicorn does):
            # its body is dropped, a chunked body's trailers are not headers.
            self._shed_here = self._ballast_in_body = True
            return
        # The ASGI way: the guarded protocol's scope and cycle (the target as parsed for the
        # decision and what it read, ``_memo``, are reused there).
        GuardedHttpToolsProtocol.on_headers_complete(self)

    def _answer_at_wire(self, at_wire: AtWire) -> bool:
        """Write the shed response when the app would shed this request; False: ASGI way.

        One function on purpose (issue 31: every call is ~0.1 us of a ~35 us request):
        the checks, the decision, the bytes (kept per status, reason, tier,
        Retry-After, keep-alive and HEAD), the guarded protocol's head bookkeeping,
        the write and the lazy keep-alive timer of ``_idle_from``."""
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            return False  # an earlier response is still to be written: keep the order
        parser = self.parser
        if self.flow.write_paused or self.access_log or parser.should_upgrade():
            return False
        limit = self.limit_concurrency
        if limit is not None and (
            len(self.connections) >= limit or len(self.tasks) >= limit
        ):  # uvicorn's 503 first
            return False
        method = parser.get_method()
        if method == b"CONNECT":
            return False
        try:
            self._parsed_url = parsed = httptools.parse_url(self.url)  # kept for the scope
            raw_path = parsed.path
            path = raw_path.decode("ascii")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            return False  # uvicorn answers it (400)
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        if root:
            path = root + path
            raw_path = root.encode("ascii") + raw_path
        client = self.client
        try:
            answer = at_wire(
                method.decode("ascii"), path, raw_path, self.headers,
                client[0] if client else None, root, self._memo,
            )  # fmt: skip
        except Exception:  # a bug here must not cost the request: the ASGI way answers it
            self.logger.exception("shed at the wire failed; the request goes the ASGI way")
            self._memo[0] = None
            return False
        if answer is None:
            return False
        keep_alive = parser.should_keep_alive() and parser.get_http_version() != "1.0"
        head = method == b"HEAD"
        shed, status, seconds, headers, body = answer
        defaults = self.server_state.default_headers
        if shed.headers or defaults:
            data = shed_bytes(
                status, headers, body, keep_alive=keep_alive, head=head, default_headers=defaults
            )
        else:
            key = (status, shed.reason, shed.priority, seconds, keep_alive, head)
            found = _WIRE.get(key)
            if found is None:
                found = shed_bytes(status, headers, body, keep_alive=keep_alive, head=head)
                if len(_WIRE) < _WIRE_MAX:
                    _WIRE[key] = found
            data = found
        # The guarded protocol's bookkeeping of a complete head (its on_headers_complete).
        self._body_done = False
        self._in_head = self._began = False
        self._head_bytes = 0
        self._head_since = None
        # (Nothing joined is pending: no response is in progress, see above.)
        self.transport.write(data)
        self.server_state.total_requests += 1  # what uvicorn's on_response_complete counts
        if keep_alive:  # ``_idle_from`` inlined
            self._idle_since = now = self.loop.time()
            if self._idle_timer is None:
                self._idle_timer = self.loop.call_at(
                    now + self.timeout_keep_alive, self._idle_check
                )
        else:
            self._close_when_read = self._dropping = True
        return True

    def on_response_complete(self) -> None:
        """uvicorn's (0.55) end of a response, with the lazy keep-alive timer of
        ``_idle_from`` instead of a ``call_later`` per response (and a ``cancel`` at the
        next request's first byte): the guarded protocol's flush, the request counted,
        reading resumed, the next pipelined request started or the connection idle."""
        if self._at_wire is None:
            super().on_response_complete()
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.timeout_keep_alive_task is not None:  # ``_unset_keepalive_if_required``
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        flow = self.flow
        if flow.read_paused:  # ``flow.resume_reading``
            flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = now = self.loop.time()  # ``_idle_from`` inlined
            if self._idle_timer is None:
                self._idle_timer = self.loop.call_at(
                    now + self.timeout_keep_alive, self._idle_check
                )

    def _idle_from(self, now: float) -> None:
        """uvicorn's keep-alive timeout after a response, from ``now``, lazily: one timer per
        connection re-armed when it fires early, instead of a ``call_later`` per response
        and a ``cancel`` at the next byte (``data_received`` only clears ``_idle_since``)."""
        self._idle_since = now
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(now + self.timeout_keep_alive, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None or self.transport.is_closing():
            return
        due = since + self.timeout_keep_alive
        if self.loop.time() < due - _TIMER_SLACK_S:
            self._idle_timer = self.loop.call_at(due, self._idle_check)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        self._idle_since = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._idle_since = None
        if (
            self._at_wire is None
            or self._linger is not None
            or self.timeout_keep_alive_task is not None
            or self._writing is not None
        ):
            super().data_received(data)
        else:
            # The guarded protocol's and uvicorn's ``data_received`` fused for the common
            # read (not lingering, no keep-alive task, no joined bytes to flush): one call
            # instead of three per read (issue 31); the same steps in the same order.
            if self._in_head:
                self._head_bytes += len(data)
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                msg = "Invalid HTTP request received."  # uvicorn's (0.55) two except arms
                self.logger.warning(msg)
                self.send_400_response(msg)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            if self._in_head and self._head_bytes > self.max_header_bytes and self._linger is None:
                self._refuse(431)
        if self._close_when_read and self._linger is None:
            # The closing answer's request body is still arriving: close lingering.
            self._close_when_read = False
            self._linger_close()

    def on_body(self, body: bytes) -> None:
        if not self._shed_here:
            super().on_body(body)

    def on_message_complete(self) -> None:
        """The guarded protocol's, or the end of a request answered here: its body was
        dropped, the connection closes if it must."""
        if not self._shed_here:
            super().on_message_complete()
            return
        self._body_done = True
        self._shed_here = False
        self._in_head = True
        self._head_bytes = 0
        if self._close_when_read:
            self._close_when_read = False
            if not self.transport.is_closing():
                self.transport.close()


__all__ = ["WireShedProtocol", "shed_bytes"]

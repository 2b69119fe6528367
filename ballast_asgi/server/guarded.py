"""Server-side guards uvicorn lacks: a request-head timeout and a request-head size cap.

uvicorn (httptools) closes idle keep-alive connections after
``--timeout-keep-alive`` but has no limit on how long a request head may take
to arrive (a connection that sends nothing, or one header byte a second, is
kept forever) and none on how large the head may grow (httptools buffers a
64 MB header value; h11 stops at ``h11_max_incomplete_event_size``, 16 KiB by
default). ``guarded_protocol(server_config)`` returns an ``HttpToolsProtocol``
subclass that adds both:

* ``header_timeout_ms``: from the connection's start, or the first byte of a
  request, to the end of its head. Exceeded: ``408`` (when some bytes came)
  and the connection is closed. Between requests uvicorn's keep-alive timeout
  applies.
* ``max_header_bytes``: bytes received while a head is incomplete (request
  line and headers, counted per read). Exceeded: ``431`` and close, before the
  app sees the request. The stack's own 431 (header count and bytes, see
  docs/security.md) still applies to what gets through.

Both refusals close as nginx does (lingering close): the answer is written,
the sending side shut (FIN), and whatever the client still sends is read and
discarded until it closes, goes quiet for ``LINGER_IDLE_S`` or
``LINGER_MAX_S`` passed. A plain ``close()`` with unread bytes in the socket
makes the kernel send a reset, which can destroy the answer before the
client reads it (issue 27 item 7: a head over the limit by more than the
socket buffer got a reset instead of its 431). The same close is used for
uvicorn's own 400 (a malformed head) and when the app's answer closes the
connection while the request body is still arriving (the stack's 413 for a
declared body, its 4xx refusals).

A request that asks to switch protocols and is not switched (``Connection:
upgrade`` with an ``Upgrade`` other than a websocket uvicorn takes, and
``CONNECT``): httptools parses nothing after its head, so the connection is
closed after the answer (``connection: close``) instead of holding a
keep-alive connection on which no later request would ever be read (issue
27 item 2; the stack refuses such a request when it declares a body, and
``CONNECT`` always, with 405). A ``CONNECT`` in authority form
(``CONNECT host:443``), which uvicorn cannot turn into a scope, gets the
same 405 here.

Each request runs in a ``ResponseCycle`` (``cycle.py``): uvicorn's request
cycle with fewer steps per request, its writes joined per response; the
request's scope and cycle are built here in one step when its head is
complete (uvicorn's ``on_message_begin`` and ``on_headers_complete`` fused,
the same scope), and request trailers are dropped here (``proxy/server.py``'s
guard, which patches uvicorn's class, does not reach these methods). With TLS
(``server.ssl_certfile``) the handshake is done by ``ballast_asgi.server.tls``:
bounded by ``header_timeout_ms``, counted against ``max_connections`` from
accept, and the head timer runs from accept. How uvicorn is made to use this
protocol (the CLI's settings, adoption of ``uvicorn ballast_asgi.gateway:app``)
is ``serve.py``, which also re-exports every name of this module.

Longer than 300 lines on purpose: uvicorn's per-request callbacks
(``on_message_begin``, ``on_header``, ``on_headers_complete``, ``on_body``,
``on_message_complete``, ``on_response_complete``, ``connection_lost``) are
written out here once, fused with the guards' steps, instead of each calling
uvicorn's method around ours (a Python call less per step, issue 31).
"""

from __future__ import annotations

import asyncio
import contextvars
import urllib.parse
from typing import Any

import httptools
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ballast_asgi.config.models import ServerConfig
from ballast_asgi.middleware.admission import WIRE_READ
from ballast_asgi.server.cycle import ResponseCycle

#: A head timer that fires this close to its due time times the head out (loop timers
#: may fire up to their clock's resolution early).
_TIMER_SLACK_S = 0.001

#: Lingering close after a refusal: stop when the client is quiet this long, or after the max.
LINGER_IDLE_S = 2.0
LINGER_MAX_S = 10.0


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """httptools protocol with a head timeout (408) and a head size cap (431)."""

    header_timeout_s: float = ServerConfig().header_timeout_ms / 1000.0
    max_header_bytes: int = ServerConfig().max_header_bytes
    cycle: ResponseCycle  # type: ignore[assignment]  # ours, not uvicorn's (``cycle.py``)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._began = False
        #: Loop time the current head began (connection start or first byte); None between.
        self._head_since: float | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        #: The request cycle holding joined response bytes not written yet (``cycle.py``).
        self._writing: ResponseCycle | None = None
        #: The request head is complete: fields the parser still reports are trailers.
        self._ballast_in_body = False
        #: The request target as parsed by the wire's decision (``wire.py``), reused once.
        self._parsed_url: Any = None
        #: What the wire's decision read (``WIRE_READ``), handed to the request's scope.
        self._memo: list[object] = [None]
        self._fresh_context = bool(getattr(self.config, "reset_contextvars", False))
        self._discard = self.tasks.discard
        #: Loop time the connection was accepted, when that was before ``connection_made``
        #: (set by ``serve_tls.TlsFront``: the handshake counts against the head timeout).
        self.accepted_at: float | None = None
        #: Lingering after a refusal: (loop time of the last read, loop time to stop by).
        self._linger: tuple[float, float] | None = None
        #: The current request's body has been read to its end (or there is no request).
        self._body_done = True
        #: A protocol switch was asked and not made: httptools parses nothing more here.
        self._unswitched = False
        #: The app's lane (``Gateway.serve_in_lane``, ADR 0020): given a request's scope and
        #: cycle, it serves the request itself (True) or leaves it to the ASGI task.
        self._lane: Any = getattr(self.app, "serve_in_lane", None)
        #: The cycle being served (``self.cycle`` is the newest: a pipelined one waits).
        self._serving: ResponseCycle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_begins(self.accepted_at)

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's (0.55), the cycle woken without its event, and the head timer off."""
        self._head_since = None
        self._linger = None
        self._disarm()
        self.connections.discard(self)
        if self.logger.level <= TRACE_LOG_LEVEL:
            prefix = "{}:{} - ".format(*self.client) if self.client else ""
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection lost", prefix)
        cycle = self.cycle
        if cycle is not None:
            if not cycle.response_complete:
                cycle.left()  # disconnected; the lane's or the proxy's upstream wait ends
            cycle.wake()
        serving = self._serving
        if serving is not None and serving is not cycle and not serving.response_complete:
            serving.left()  # pipelined: the request in service is not the newest one
            serving.wake()
        if self.flow is not None:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
            self._unset_keepalive_if_required()
        self.parser = None  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:  # refused: read and discard until the client is done
            self._linger = (self.loop.time(), self._linger[1])
            return
        writing = self._writing
        if writing is not None:  # the protocol may write (400) itself: the response first
            writing.flush()
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes and self._linger is None:
            self._refuse(431)

    def on_message_begin(self) -> None:
        """uvicorn's, without its scope (built with the cycle when the head is complete), and
        the head timed (``_message_begins`` inlined)."""
        self._ballast_in_body = False
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._parsed_url = None
        self._in_head = self._began = True
        if self._head_since is None:
            self._head_since = since = self.loop.time()
            if self._head_timer is None:
                self._arm(since + self.header_timeout_s)

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's (0.55) ``on_header``; a field after the head is a trailer: dropped."""
        if self._ballast_in_body:
            return
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing OWS (RFC 9110 5.5 excludes it)
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _message_begins(self) -> None:
        """A request head began: time it (``ballast_asgi/server/wire.py`` calls this too)."""
        self._in_head = self._began = True
        if self._head_since is None:
            self._head_begins()

    def on_headers_complete(self) -> None:
        """uvicorn's (0.55) scope and request cycle, built here in one step (its
        ``on_message_begin`` and ``on_headers_complete``: the same scope, the same cycle
        guarantees, see ``cycle.py``), after the guards' checks of a complete head."""
        parser = self.parser
        method = parser.get_method()
        url = self.url
        if method == b"CONNECT" and not url.startswith(b"/"):
            self._in_head = False  # authority form: uvicorn would answer 400; refused as nginx
            self._refuse(405)
            return
        self._ballast_in_body = True  # what follows the head is not a header (trailers)
        self._body_done = False
        self._in_head = self._began = False
        self._head_bytes = 0
        self._head_since = None  # the timer, if armed, finds nothing to do and lapses
        http_version = parser.get_http_version()
        root_path = self.root_path
        upgrade = parser.should_upgrade()
        if upgrade and self._should_upgrade():  # a websocket: uvicorn's scope up to here
            self.scope = self._scope(method, http_version)
            return
        parsed = self._parsed_url
        if parsed is None:
            parsed = httptools.parse_url(url)
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": http_version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
            "method": method.decode("ascii"),
            "path": root_path + path,
            "raw_path": root_path.encode("ascii") + raw_path,
            "query_string": parsed.query or b"",
        }
        self.scope = scope  # type: ignore[assignment]
        memo = self._memo
        if memo[0] is not None:  # read at the wire and not shed: admission reuses it
            scope[WIRE_READ] = memo[0]
            memo[0] = None
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        else:
            app = self.app
        if upgrade:  # not switched: nothing after this head is read
            self._unswitched = True
        existing = self.cycle
        self.cycle = cycle = ResponseCycle(
            self,
            scope,
            not upgrade and http_version != "1.0" and parser.should_keep_alive(),
            self.expect_100_continue,
        )
        if existing is None or existing.response_complete:
            self._serving = cycle
            lane = self._lane  # the app's lane (ADR 0020) takes the request, or the task runs
            if lane is None or upgrade or app is not self.app or not lane(scope, cycle):
                self._start_asgi_task(cycle, app)
        else:  # pipelined: queued behind the response in progress
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))  # type: ignore[arg-type]

    def _scope(self, method: bytes, http_version: str) -> Any:
        """uvicorn's scope of a request that switches to a websocket (no path: not read)."""
        return {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": http_version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
            "method": method.decode("ascii"),
        }

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn's, with its config and the task set's ``discard`` read once."""
        if self._fresh_context:
            task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
        else:
            task = self.loop.create_task(cycle.run_asgi(app))
        cycle.task = task
        self._serving = cycle
        task.add_done_callback(self._discard)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        """uvicorn's (0.55): the body kept for ``receive`` (reading paused past 64 KiB)."""
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        kept = cycle.body
        if kept is None:
            kept = cycle.body = bytearray(body)
        else:
            kept += body
        if len(kept) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.wake()

    def on_response_complete(self) -> None:
        """uvicorn's (0.55): counted, reading resumed, the next pipelined request or the
        keep-alive timeout (the cycle wrote its joined bytes before calling this)."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_message_complete(self) -> None:
        """uvicorn's (0.55): the body is complete; the guards' head count starts again."""
        self._body_done = True
        cycle = self.cycle
        if not (
            (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete
        ):
            cycle.more_body = False
            cycle.wake()
        self._in_head = True
        self._head_bytes = 0

    def _head_begins(self, since: float | None = None) -> None:
        """Start timing a head; arm the connection's one timer only when none is pending.

        The timer is lazy: a head that completes in time does not cancel it
        (``_head_since`` goes back to None); when it fires it re-arms for the
        head in progress, if any, or lapses. So a keep-alive connection costs
        one timer per ``header_timeout_s``, not a ``call_later`` + ``cancel``
        per request (issue 18).
        """
        self._head_since = self.loop.time() if since is None else since
        if self._head_timer is None:
            self._arm(self._head_since + self.header_timeout_s)

    def _arm(self, when: float) -> None:
        self._head_timer = self.loop.call_at(when, self._head_check)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_check(self) -> None:
        """The timer fired: time out the head in progress, re-arm for a later one, or lapse."""
        self._head_timer = None
        since = self._head_since
        if since is None:
            return
        due = since + self.header_timeout_s
        if self.loop.time() < due - _TIMER_SLACK_S:  # a later head than the one armed for
            self._arm(due)
        else:
            self._head_timeout()

    def _head_timeout(self) -> None:
        self._head_since = None
        if self._head_bytes or self._began:
            self._refuse(408)
        elif not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int) -> None:
        """Answer ``status`` with an empty body and close (nothing reached the app)."""
        self._head_since = None
        self._disarm()
        if self.transport.is_closing() or self._linger is not None:
            return
        self.logger.warning("request head refused with %d (%d bytes)", status, self._head_bytes)
        self.transport.write(
            STATUS_LINE[status] + b"content-length: 0\r\nconnection: close\r\n\r\n"
        )
        self._linger_close()

    def _close_after_response(self) -> bool:
        """The app's answer closes the connection: linger if the request body is still coming.

        (A 413 for a declared body, a 4xx from admission: closing at once with the
        body still arriving would reset the connection under the answer.)
        """
        if (self._body_done and not self._unswitched) or self._linger is not None:
            return False
        self._linger_close()
        return True

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a malformed request, closed lingering (the same bytes)."""
        content = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(msg)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                msg.encode("ascii"),
            ]
        )
        self._head_since = None
        self.transport.write(b"".join(content))
        self._linger_close()

    def _linger_close(self) -> None:
        """Shut the sending side after the answer; read and discard until the client is done."""
        self._disarm()
        transport = self.transport
        now = self.loop.time()
        self._linger = (now, now + LINGER_MAX_S)
        try:
            if transport.can_write_eof():
                transport.write_eof()  # FIN once the answer is out; reading goes on
            transport.resume_reading()
        except (NotImplementedError, RuntimeError, OSError):  # e.g. TLS: no half-close
            pass
        self._head_timer = self.loop.call_at(now + LINGER_IDLE_S, self._linger_check)

    def _linger_check(self) -> None:
        """Close once the client was quiet for ``LINGER_IDLE_S`` or ``LINGER_MAX_S`` passed."""
        self._head_timer = None
        linger = self._linger
        if linger is None:
            return
        last, until = linger
        due = min(last + LINGER_IDLE_S, until)
        if self.loop.time() < due - _TIMER_SLACK_S:
            self._head_timer = self.loop.call_at(due, self._linger_check)
        else:
            self._linger = None
            self.transport.close()


def guarded_protocol(
    server: ServerConfig, base: type[GuardedHttpToolsProtocol] | None = None
) -> type[GuardedHttpToolsProtocol]:
    """A ``GuardedHttpToolsProtocol`` (or the subclass ``base``) with the limits of ``server``.

    The gateway's ``server_protocol`` is such a ``base``: the ``WireShedProtocol``
    of ``ballast_asgi/server/wire.py`` while ``server.shed_at_wire`` is on.
    """
    attrs = {
        "header_timeout_s": server.header_timeout_ms / 1000.0,
        "max_header_bytes": server.max_header_bytes,
    }
    base = base or GuardedHttpToolsProtocol
    return type(base.__name__, (base,), attrs)

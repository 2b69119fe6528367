"""The request head, read once at admission (pure).

``read_head(headers, limits, method, key_header)`` walks the raw ASGI header
list once and returns what every later stage needs (``RequestHead``: declared
length, chunked, idempotency key, ``Host``, the raw ``X-Priority`` values,
``X-Deadline-Ms``, the consumer key), or raises ``HeaderError`` with the status
to answer. Admission calls it once per request (with ``check_target``) and puts
the value on the context: the classifier, the body, retry and breaker stages
and the proxy read ``ctx.head`` and never the header list for these values
(``tests/proxy/test_head_once.py`` counts the walks):

* **400** a request target that is not origin-form (does not start with ``/``:
  ``*``, ``*@host:port/...``, absolute or authority form). Such a target is
  never forwarded: the upstream URL is built from the configured origin plus
  this path, and nothing else may supply a host. ``OPTIONS *`` is refused too.
* **431** more than ``max_headers`` header fields, or more than
  ``max_header_bytes`` of names and values in total (defaults 100 and 32 KiB:
  nginx's and Node's orders of magnitude; ``0`` disables a limit).
* **413** a declared ``Content-Length`` above ``max_body_bytes``, before a byte
  of the body is read or any budget is reserved.
* **400** a ``Content-Length`` that is not a number, or several that disagree;
  ``X-Deadline-Ms`` given more than once with different values (like
  ``X-Priority``, whose trust rules live in ``classify.py``).

It is also the one parse of the request's *framing* (issue 27): every stage
and the proxy take the body's length and coding from ``RequestHead`` and
nothing reads ``Content-Length``/``Transfer-Encoding`` again. What a client
may declare is narrowed to what has exactly one meaning for every parser on
the way (RFC 9112 section 6, and what nginx refuses):

* **400** ``Content-Length`` together with ``Transfer-Encoding`` (a classic
  desync: RFC 9112 section 6.1 lets a server refuse it, nginx does);
* **501** a ``Transfer-Encoding`` other than exactly one ``chunked``
  (``gzip, chunked``, ``chunked, chunked``, ``identity``, ``xchunked``: nginx's
  "unknown Transfer-Encoding");
* **400** ``Host`` given more than once (RFC 9112 section 3.2; nginx): the
  parts of the gateway that read it would otherwise disagree on its value;
* **405** ``CONNECT`` (never proxied, as nginx; the ASGI server does not hand
  over any bytes after its head);
* **400** a request that asks to switch protocols (``Connection: upgrade``
  with an ``Upgrade`` header) *and* declares a body: the server parses nothing
  after such a head, so the body would never arrive (issue 27 item 2). A
  body-less one is an ordinary request (``Upgrade`` is hop-by-hop and dropped;
  ``upgrade`` records it; the guarded server protocol closes such a connection
  after the answer, see ``ballast_asgi/server/serve.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from ballast_asgi.core.errors import HeaderError

DEFAULT_MAX_HEADERS = 100
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
#: Request bodies (the body stage): replayable size, chunk gap, minimum average rate.
DEFAULT_REPLAY_MAX_BYTES = 1024 * 1024
DEFAULT_READ_TIMEOUT_MS = 10_000
DEFAULT_MIN_RATE_BYTES_PER_S = 1024

_CONTENT_LENGTH = b"content-length"
_TRANSFER_ENCODING = b"transfer-encoding"
_IDEMPOTENCY_KEY = b"idempotency-key"
_PRIORITY = b"x-priority"
_DEADLINE = b"x-deadline-ms"
_HOST = b"host"
_CONNECTION = b"connection"
_UPGRADE = b"upgrade"
#: The headers ``read_head`` acts on, by (lower-case) name: one dict lookup per header.
_K_LENGTH, _K_CODING, _K_HOST, _K_DEADLINE, _K_PRIORITY, _K_IDEMPOTENCY = range(6)
_K_CONNECTION, _K_UPGRADE = 6, 7
_KINDS = {
    _CONTENT_LENGTH: _K_LENGTH,
    _TRANSFER_ENCODING: _K_CODING,
    _HOST: _K_HOST,
    _DEADLINE: _K_DEADLINE,
    _PRIORITY: _K_PRIORITY,
    _IDEMPOTENCY_KEY: _K_IDEMPOTENCY,
    _CONNECTION: _K_CONNECTION,
    _UPGRADE: _K_UPGRADE,
}
#: A Content-Length with more digits than this is beyond any body limit (and int()'s).
_MAX_LENGTH_DIGITS = 18


@dataclass(slots=True, frozen=True)
class HeadLimits:
    """Bounds on the request head (0: no bound)."""

    max_headers: int = DEFAULT_MAX_HEADERS
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    #: Larger declared bodies get 413 at once (None: no bound).
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_headers", "max_header_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


class RequestHead(NamedTuple):
    """The request headers the stages act on (a named tuple: built once per request,
    half the cost of a frozen dataclass to build, and as immutable)."""

    #: Declared ``Content-Length`` (None when absent).
    content_length: int | None = None
    #: ``Transfer-Encoding`` present: a body of unknown length follows.
    chunked: bool = False
    #: An ``Idempotency-Key`` header was sent (the request may be retried).
    idempotency_key: bool = False
    #: The first raw ``X-Priority`` value (None when absent).
    priority: bytes | None = None
    #: The raw ``X-Deadline-Ms`` value (None when absent).
    deadline: bytes | None = None
    #: A body-less request that asked to switch protocols (not switched: served as plain HTTP).
    upgrade: bool = False
    #: The ``Host`` value (None when absent; it is never given twice).
    host: bytes | None = None
    #: Further raw ``X-Priority`` values after the first (the classifier checks they agree).
    more_priorities: tuple[bytes, ...] = ()
    #: The first value of the consumer-key header ``read_head`` was asked for (None: absent).
    consumer_key: bytes | None = None

    @property
    def has_body(self) -> bool:
        """Whether a request body may follow."""
        return self.chunked or bool(self.content_length)


NO_HEAD = RequestHead()
#: Builds a ``RequestHead`` from all its fields in order (what its ``__new__`` does, in C).
_new_head: Callable[[type[RequestHead], tuple[object, ...]], RequestHead] = tuple.__new__


def check_target(raw_path: bytes | str | None, path: str = "/") -> None:
    """Refuse a request target that is not origin-form (400): ``raw_path`` (when the
    server gave one) and ``path`` both start with ``/``."""
    if not path.startswith("/") or (raw_path and raw_path[0] not in (b"/"[0], "/")):
        raise HeaderError("request target", "must be origin-form (start with /)")


def read_head(
    headers: Iterable[tuple[bytes, bytes]],
    limits: HeadLimits,
    method: str = "GET",
    key_header: bytes | None = None,
) -> RequestHead:
    """One pass over the raw headers: bounds and framing checked, the interesting values kept.

    ``key_header``: a (lower-case) header whose first value is kept as ``consumer_key``.
    """
    if method == "CONNECT":
        raise HeaderError("method", "CONNECT is not proxied", 405)
    count = size = hosts = 0
    length: bytes | None = None
    codings: list[bytes] | None = None
    idempotent = upgrade_asked = upgrade_named = False
    deadline: bytes | None = None
    priority: bytes | None = None
    host: bytes | None = None
    key: bytes | None = None
    more: list[bytes] | None = None
    kinds = _KINDS
    for name, value in headers:
        count += 1
        size += len(name) + len(value)
        if key_header is not None and name == key_header and key is None:
            key = value
        kind = kinds.get(name)  # one lookup: most headers are none of these
        if kind is None:
            continue
        if kind == _K_LENGTH:
            length = value if length is None else _same(length, value, "Content-Length")
        elif kind == _K_CODING:
            if codings is None:
                codings = [value]
            else:
                codings.append(value)
        elif kind == _K_HOST:
            hosts += 1
            host = value
        elif kind == _K_DEADLINE:
            deadline = value if deadline is None else _same(deadline, value, "X-Deadline-Ms")
        elif kind == _K_PRIORITY:
            if priority is None:
                priority = value
            elif more is None:
                more = [value]
            else:
                more.append(value)
        elif kind == _K_IDEMPOTENCY:
            idempotent = True
        elif kind == _K_CONNECTION:
            upgrade_named = upgrade_named or _names_upgrade(value)
        else:
            upgrade_asked = True
    max_headers, max_bytes = limits.max_headers, limits.max_header_bytes
    if (max_headers and count > max_headers) or (max_bytes and size > max_bytes):
        _check_size(count, size, limits)
    if hosts > 1:
        raise HeaderError("Host", "appears more than once")
    chunked = False if codings is None else _chunked(codings, length)
    size_ = None if length is None else _length(length, limits)
    upgrade = upgrade_asked and upgrade_named
    if upgrade and (chunked or size_):
        raise HeaderError("Upgrade", "is refused on a request with a body")
    extra = () if more is None else tuple(more)
    fields = (size_, chunked, idempotent, priority, deadline, upgrade, host, extra, key)
    return _new_head(RequestHead, fields)  # ``RequestHead(*fields)`` without its Python __new__


def _names_upgrade(value: bytes) -> bool:
    """Whether one ``Connection`` value lists the ``upgrade`` token."""
    return any(token.strip().lower() == _UPGRADE for token in value.split(b","))


def _chunked(codings: list[bytes], length: bytes | None) -> bool:
    """Whether the body is chunked: only exactly one ``chunked`` coding, never with a length."""
    if not codings:
        return False
    if length is not None:
        raise HeaderError("Transfer-Encoding", "must not be sent with Content-Length")
    if len(codings) != 1 or codings[0].strip().lower() != b"chunked":
        raise HeaderError("Transfer-Encoding", "must be exactly 'chunked'", 501)
    return True


def _same(previous: bytes | None, value: bytes, header: str) -> bytes:
    if previous is not None and previous.strip() != value.strip():
        raise HeaderError(header, "appears more than once with different values")
    return value


def _check_size(count: int, size: int, limits: HeadLimits) -> None:
    if limits.max_headers and count > limits.max_headers:
        raise HeaderError("headers", f"are too many (at most {limits.max_headers})", 431)
    if limits.max_header_bytes and size > limits.max_header_bytes:
        limit = limits.max_header_bytes
        raise HeaderError("headers", f"are too large (at most {limit} bytes)", 431)


def _length(raw: bytes | None, limits: HeadLimits) -> int | None:
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.isdigit():
        raise HeaderError("Content-Length", "must be a non-negative integer")
    digits = raw.lstrip(b"0")
    if len(digits) > _MAX_LENGTH_DIGITS:
        if limits.max_body_bytes is None:
            raise HeaderError("Content-Length", "is too large")
        length = limits.max_body_bytes + 1
    else:
        length = int(digits or b"0")
    if limits.max_body_bytes is not None and length > limits.max_body_bytes:
        raise HeaderError(
            "Content-Length", f"is larger than the limit of {limits.max_body_bytes} bytes", 413
        )
    return length

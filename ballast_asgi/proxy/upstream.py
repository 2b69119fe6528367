"""Where an attempt goes: the ``Upstream`` value and the selector seam.

``Upstream.parse(url)`` splits an ``http(s)://`` URL once, at start-up, into
scheme, host, port and base path. Every upstream request URL is then *built*
from those parts plus an origin-form target (``/path?query``); nothing ever
concatenates the origin string with a client's target and parses the result
again (that is how ``GET *@evil:80/x`` once reached another host: issue 11).

Credentials in the URL (``http://user:pw@host``) are kept out of every
display: ``str()``, ``repr()``, ``display`` and errors show
``http://***@host`` at most. They are not sent upstream (the proxy forwards
the client's own ``Authorization``); ``has_credentials`` says they were given.

The selector seam (``Selector``) is what the proxy asks for an attempt's
upstream: ``choose(ctx, exclude)`` returns one (``exclude``: the upstreams
earlier attempts of this request used, so a pool can retry elsewhere; a
selector with nothing else to offer may return an excluded one), and
``report(upstream, outcome, rtt_s, now)`` hands back the attempt's
``AttemptOutcome`` and time to the response head. ``SingleUpstream`` is the
default (one upstream, nothing to balance); a pool, a canary split or a
discovered instance list plug in here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.redact import redact_url
from ballast_asgi.core.upstream_url import DEFAULT_PORTS, UpstreamURLError, split_upstream_url

_DEFAULT_PORTS = DEFAULT_PORTS


@dataclass(frozen=True, slots=True)
class Upstream:
    """One upstream origin plus base path, from parsed parts (credentials never displayed)."""

    scheme: str
    #: The host as it goes on the wire: lower-case ASCII (IDNA), IPv6 without brackets.
    host: str
    port: int
    #: ``b""`` or ``b"/base"`` (no trailing slash), ASCII, prefixed to every target.
    base_path: bytes = b""
    _credentials: str | None = field(default=None, repr=False, compare=False)
    _netloc: bytes = field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port == _DEFAULT_PORTS[self.scheme] else f":{self.port}"
        object.__setattr__(self, "_netloc", f"{host}{port}".encode("ascii"))

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """Split ``url`` (``core.upstream_url``); raises ``UpstreamURLError`` (redacted)."""
        parts = split_upstream_url(url)
        base = httpx.URL(scheme=parts.scheme, host=parts.host, path=parts.path or "/").raw_path
        return cls(
            scheme=parts.scheme,
            host=parts.host,
            port=parts.port,
            base_path=base.rstrip(b"/"),
            _credentials=parts.credentials,
        )

    @property
    def netloc(self) -> bytes:
        """``host[:port]`` as a ``Host`` header value (default port left out)."""
        return self._netloc

    @property
    def origin(self) -> str:
        """``scheme://host[:port]``, never with credentials."""
        return f"{self.scheme}://{self.netloc.decode('ascii')}"

    @property
    def display(self) -> str:
        """The URL for logs, snapshots and errors: credentials shown as ``***``."""
        auth = "***@" if self._credentials else ""
        return f"{self.scheme}://{auth}{self.netloc.decode('ascii')}{self.base_path.decode()}"

    @property
    def has_credentials(self) -> bool:
        """Whether the configured URL carried ``user[:password]@`` (never shown)."""
        return self._credentials is not None

    def __str__(self) -> str:
        return self.display

    def url(self, target: bytes) -> httpx.URL:
        """The upstream URL for an origin-form ``target`` (``/path[?query]``, printable ASCII).

        An empty path stands for the base path itself (``b""`` or ``b"?q"``).

        Built from the parts: scheme, host and port are this upstream's
        whatever the target holds, and the target becomes path and query
        as they are (no re-encoding). Raises ``ValueError`` for a target that
        is not origin-form. Fast path: the pre-built reference gets the new
        path and query (2 us instead of httpx's 14 us parser).
        """
        if target[:1] not in (b"/", b"?", b""):
            raise ValueError("request target is not origin-form")
        path, sep, query = (self.base_path + target).decode("ascii").partition("?")
        path = path or "/"
        ref = _reference(self)
        if ref is None:
            return httpx.URL(scheme=self.scheme, host=self.host, port=self.port,
                             raw_path=(path + sep + query).encode("ascii"))  # fmt: skip
        url = httpx.URL.__new__(httpx.URL)
        url._uri_reference = ref._replace(path=path, query=query if sep else None)
        return url


_REFERENCES: dict[tuple[str, str, int], Any] = {}


def _reference(upstream: Upstream) -> Any:
    """httpx's parsed form of the upstream's origin when it is the NamedTuple we expect."""
    key = (upstream.scheme, upstream.host, upstream.port)
    ref = _REFERENCES.get(key)
    if ref is None:
        origin = httpx.URL(scheme=upstream.scheme, host=upstream.host, port=upstream.port)
        ref = getattr(origin, "_uri_reference", None)
        fields = getattr(ref, "_fields", ())
        ref = ref if "path" in fields and "query" in fields else False
        _REFERENCES[key] = ref
    return ref or None


class Selector(Protocol):
    """Chooses the upstream for each attempt and hears how the attempt went."""

    def choose(self, ctx: Any, exclude: Collection[Upstream] = ()) -> Upstream:
        """The upstream for this attempt (``ctx``: the ``RequestContext`` or None)."""
        ...

    def report(
        self, upstream: Upstream, outcome: AttemptOutcome, rtt_s: float | None, now: float
    ) -> None:
        """The attempt's outcome and its time to the response head (None without a head)."""
        ...

    def report_body(self, upstream: Upstream, complete: bool, now: float) -> None:
        """How the body of a response whose head was passed on ended: ``complete``, or
        cut by the upstream (a reset mid-body: the client's connection was aborted).

        Not called when the client went away. The attempt was settled at its head;
        this only tells the upstream's health, so resets after the head count too.
        """
        ...

    def upstreams(self) -> Sequence[Upstream]:
        """Every upstream this selector may choose (for snapshots)."""
        ...


class SingleUpstream:
    """The default selector: one upstream, nothing to balance, reports ignored.

    The proxy does not call the reports of this exact class (no clock read for a
    no-op); a subclass that overrides them is called as any selector.
    """

    __slots__ = ("upstream",)

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    def choose(self, ctx: Any, exclude: Collection[Upstream] = ()) -> Upstream:
        """Always the one upstream (a retry has nowhere else to go)."""
        return self.upstream

    def report(
        self, upstream: Upstream, outcome: AttemptOutcome, rtt_s: float | None, now: float
    ) -> None:
        """Nothing to learn with a single upstream."""

    def report_body(self, upstream: Upstream, complete: bool, now: float) -> None:
        """Nothing to learn with a single upstream."""

    def upstreams(self) -> Sequence[Upstream]:
        """The one upstream."""
        return (self.upstream,)


__all__ = ["Selector", "SingleUpstream", "Upstream", "UpstreamURLError", "redact_url"]

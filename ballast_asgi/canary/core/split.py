"""Which version serves a request: a weighted split the client cannot steer.

The key is, in order: the gateway's own signed cookie (``signed_cookie``,
``canary.signed_cookie``: an id the gateway drew, with a MAC under the
secret, so a client can keep its version but not choose one), the sticky
cookie's value, the sticky header's value, then (only with
``use_request_id``, off by default) ``X-Request-Id``. A key is
hashed with a keyed BLAKE2b under a *secret* to a point ``u`` in [0, 1); the
request goes to the canary when ``u < weight``. Because the point does not
depend on the weight, raising the weight (a ramp step) only moves stable users
to the canary, never back, and a rollback (weight 0) sends everyone to stable.
A request without any key draws ``u`` from the injected ``random.Random``, so
by default every request is an independent draw (issue 27: a client that
could pick its key offline put 50 of 50 requests on a 2 % canary).

The secret is ``canary.salt`` when configured (several gateways that must
agree share it), else ``PROCESS_SECRET``: 32 random bytes drawn when this
module is first imported, i.e. once per start of the gateway process and
inherited by ``--workers`` children (they fork after the parent imported it),
so the workers of one gateway agree. It is never logged or shown.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import secrets

from ballast_asgi.canary.core.blocks import Version
from ballast_asgi.core.types import RawHeaders

_REQUEST_ID = b"x-request-id"
_SCALE = float(2**64)
#: The signed cookie's id: 128 random bits in hex; its MAC: 96 bits in hex.
_ID_HEX = 32
_MAC_BYTES = 12

#: The split's secret when ``canary.salt`` is not configured (one per process start).
PROCESS_SECRET = secrets.token_bytes(32)


class Split:
    """Assign requests to stable or canary at a weight, stably per key."""

    def __init__(
        self,
        *,
        sticky_header: str | None = None,
        sticky_cookie: str | None = None,
        salt: str | None = None,
        use_request_id: bool = False,
        signed_cookie: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._header = sticky_header.lower().encode("latin-1") if sticky_header else None
        self._cookie = sticky_cookie.encode("latin-1") if sticky_cookie else None
        secret = PROCESS_SECRET if salt is None else salt.encode()
        self._salt = hashlib.blake2b(secret, digest_size=32).digest()
        self._request_id = _REQUEST_ID if use_request_id else None
        self._signed = signed_cookie.encode("latin-1") if signed_cookie else None
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"Split(header={self._header!r}, cookie={self._cookie!r}, salt=<secret>)"

    def key(self, headers: RawHeaders) -> bytes | None:
        """The request's sticky key (cookie, then header, then request id if enabled), or None."""
        found: dict[bytes, bytes] = {}
        wanted = tuple(n for n in (self._header, self._request_id) if n is not None)
        cookie: bytes | None = None
        for name, value in headers:
            lname = name.lower()
            if lname == b"cookie":
                if self._signed is not None:
                    ident = self.verified(_cookie_value(value, self._signed))
                    if ident is not None:
                        return b"s:" + ident
                if cookie is None and self._cookie is not None:
                    cookie = _cookie_value(value, self._cookie)
            elif lname in wanted and value:
                found.setdefault(lname, value)
        if cookie:
            return b"c:" + cookie
        for name in wanted:
            if name in found:
                return b"h:" + found[name]
        return None

    @property
    def signs(self) -> bool:
        """Whether the gateway issues its own signed cookie."""
        return self._signed is not None

    def new_ident(self) -> bytes:
        """A fresh id for a signed cookie (its point is secret, like every key's)."""
        return b"%032x" % self._rng.getrandbits(128)

    def sign(self, ident: bytes) -> bytes:
        """The signed cookie's value for ``ident``: ``<id>.<mac>``."""
        mac = hashlib.blake2b(b"cookie:" + ident, digest_size=_MAC_BYTES, key=self._salt)
        return ident + b"." + mac.hexdigest().encode()

    def verified(self, value: bytes | None) -> bytes | None:
        """The id of a signed cookie value this gateway (or one with its salt) issued, or None."""
        if not value or len(value) != _ID_HEX + 1 + 2 * _MAC_BYTES:
            return None
        ident = value[:_ID_HEX]
        return ident if hmac.compare_digest(self.sign(ident), value) else None

    def point(self, key: bytes | None) -> float:
        """The key's fixed point in [0, 1) (random for a request without a key)."""
        if key is None:
            return self._rng.random()
        digest = hashlib.blake2b(key, digest_size=8, key=self._salt).digest()
        return int.from_bytes(digest, "big") / _SCALE

    def choose(self, headers: RawHeaders, weight: float) -> Version:
        """The version for a request with these headers at this canary weight."""
        if weight <= 0.0:
            return Version.STABLE
        return Version.CANARY if self.point(self.key(headers)) < weight else Version.STABLE


def _cookie_value(header: bytes, name: bytes) -> bytes | None:
    for part in header.split(b";"):
        k, sep, v = part.strip().partition(b"=")
        if sep and k == name:
            return v.strip().strip(b'"') or None
    return None


__all__ = ["PROCESS_SECRET", "Split"]

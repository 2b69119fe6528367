"""Which version serves a request: a weighted split that keeps a user on one version.

The key is, in order: the sticky cookie's value, the sticky header's value,
then ``X-Request-Id`` (so a retried request stays on its version). A key is
hashed with a salt to a point ``u`` in [0, 1); the request goes to the canary
when ``u < weight``. Because the point does not depend on the weight, raising
the weight (a ramp step) only moves stable users to the canary, never back,
and a rollback (weight 0) sends everyone to stable. A request without any key
draws ``u`` from the injected ``random.Random``.
"""

from __future__ import annotations

import hashlib
import random

from ballast_asgi.canary.blocks import Version
from ballast_asgi.core.types import RawHeaders

_REQUEST_ID = b"x-request-id"
_SCALE = float(2**64)


class Split:
    """Assign requests to stable or canary at a weight, stably per key."""

    def __init__(
        self,
        *,
        sticky_header: str | None = None,
        sticky_cookie: str | None = None,
        salt: str = "ballast-canary",
        rng: random.Random | None = None,
    ) -> None:
        self._header = sticky_header.lower().encode("latin-1") if sticky_header else None
        self._cookie = sticky_cookie.encode("latin-1") if sticky_cookie else None
        self._salt = hashlib.blake2b(salt.encode(), digest_size=16).digest()
        self._rng = rng or random.Random()

    def key(self, headers: RawHeaders) -> bytes | None:
        """The request's sticky key (cookie, then header, then request id), or None."""
        found: dict[bytes, bytes] = {}
        for name, value in headers:
            lname = name.lower()
            if lname == b"cookie" and self._cookie is not None:
                sticky = _cookie_value(value, self._cookie)
                if sticky:
                    return b"c:" + sticky
            elif lname in (self._header, _REQUEST_ID) and value:
                found.setdefault(lname, value)
        for wanted in (self._header, _REQUEST_ID):
            if wanted is not None and wanted in found:
                return b"h:" + found[wanted]
        return None

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


__all__ = ["Split"]

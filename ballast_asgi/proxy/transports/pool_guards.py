"""Guards on the third-party connection pools: a connection the proxy cannot trust is closed.

Issue 27 (found by ``tests/proxy/test_framing_differential_response.py``): two pools
reused an upstream connection after bytes no request had asked for, and the
next request on it, possibly another client's, was answered with them
(response queue poisoning). The lean transport never does (``lean_wire.py``:
bytes nobody asked for close the connection; a response followed by more
bytes is not reused).

* ``ProxyClientResponse``: aiohttp's response class for the proxy's session.
* ``never_reuse_with_leftover_bytes``: a guard on httpcore (httpx's pool),
  installed once when the proxy builds an httpx transport.

Both reach into private names (no public switch exists); each checks them so
that a library change fails loudly rather than silently reopening the hole.
"""

from __future__ import annotations

from typing import Any

import aiohttp


class ProxyClientResponse(aiohttp.ClientResponse):
    """aiohttp's response that never leaves a connection pooled after a status the proxy
    refuses (issue 27).

    aiohttp returns an unasked ``101`` (or ``099``, ``999``) as the final response
    and, the body being empty, hands the connection back to its pool before the
    proxy sees the status: bytes the upstream sent after it (a smuggled
    ``HTTP/1.1 200 ... evil``) then answered the next request on that connection.
    The connection is closed here instead, before anything else can take it
    (no await between aiohttp's release and this check).
    """

    async def start(self, connection: Any) -> aiohttp.ClientResponse:
        protocol = connection.protocol
        response = await super().start(connection)
        if not 200 <= self.status <= 599 and protocol is not None:
            protocol.close()  # a pooled protocol that is closed is never reused
        return response


def never_reuse_with_leftover_bytes() -> None:
    """Close an httpcore connection that holds bytes after a complete response.

    httpcore returns a connection to its pool once h11 has read a response to
    its end; bytes that came in the same read after it (a second, unasked
    response: ``...ok`` + ``HTTP/1.1 200 OK ... evil``) stay in h11's buffer,
    and the next request on that connection was answered with them (response
    queue poisoning, issue 27; ``has_expired`` only sees bytes still in the
    socket). Here such a connection is closed instead of pooled, as the lean
    transport and aiohttp do. There is no public switch; the private names
    are checked so that a change in httpcore fails loudly (the e2e test
    ``test_bytes_after_a_response_never_answer_the_next_request`` covers it).
    """
    import h11
    from httpcore._async.http11 import AsyncHTTP11Connection

    if getattr(AsyncHTTP11Connection, "_ballast_guarded", False):
        return
    original = AsyncHTTP11Connection._response_closed
    if not hasattr(h11.Connection, "trailing_data"):
        raise RuntimeError("h11 changed: cannot see bytes left after a response")

    async def _response_closed(self: Any) -> None:
        state = self._h11_state
        done = state.our_state is h11.DONE and state.their_state is h11.DONE
        if done and state.trailing_data[0]:
            await self.aclose()  # bytes after the response: never reused
            return
        await original(self)

    AsyncHTTP11Connection._response_closed = _response_closed  # type: ignore[method-assign]
    AsyncHTTP11Connection._ballast_guarded = True  # type: ignore[attr-defined]


__all__ = ["ProxyClientResponse", "never_reuse_with_leftover_bytes"]

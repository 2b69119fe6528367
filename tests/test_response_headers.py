"""``response_headers``: the upstream's response headers as the client gets them.

The names are classified once per spelling (a bounded cache); the result must be
the same on the first and on every later call.
"""

from __future__ import annotations

from ballast_asgi.proxy.headers import response_headers

RAW = [
    (b"Server", b"nginx"),
    (b"Content-Length", b"1024"),
    (b"Connection", b"keep-alive, X-Secret"),
    (b"X-Secret", b"s"),
    (b"Keep-Alive", b"timeout=5"),
    (b"Proxy-Authenticate", b"Basic"),
    (b"TRANSFER-ENCODING", b"chunked"),
    (b"Location", b"http://u/x"),
    (b"Set-Cookie", b"a=1"),
    (b"set-cookie", b"b=2"),
]
EXPECTED = [
    (b"server", b"nginx"),
    (b"content-length", b"1024"),
    (b"location", b"http://u/x"),
    (b"set-cookie", b"a=1"),
    (b"set-cookie", b"b=2"),
]


def test_hop_by_hop_and_connection_named_headers_go_repeats_stay() -> None:
    """Hop-by-hop, Proxy-* and Connection-named headers are dropped; names lower-cased."""
    for _ in range(3):  # first call fills the name cache, later calls read it
        assert response_headers(RAW) == (EXPECTED, 1024, True)


def test_a_non_numeric_content_length_is_kept_but_not_trusted() -> None:
    """A Content-Length that is not digits passes through and is not used for framing."""
    for _ in range(2):
        assert response_headers([(b"Content-Length", b"12x")]) == (
            [(b"content-length", b"12x")],
            None,
            False,
        )


def test_connection_naming_content_length_drops_the_framing() -> None:
    """``Connection: content-length`` removes it and the length with it."""
    raw = [(b"content-length", b"5"), (b"connection", b"Content-Length"), (b"etag", b"x")]
    assert response_headers(raw) == ([(b"etag", b"x")], None, False)

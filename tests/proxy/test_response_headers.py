"""``response_headers``: the upstream's response headers as the client gets them.

The names are classified once per spelling (a bounded cache); the result must be
the same on the first and on every later call.
"""

from __future__ import annotations

import pytest

from ballast_asgi.proxy.headers import BadResponseHead, response_head, response_headers

RAW = [
    (b"Server", b"nginx"),
    (b"Content-Length", b"1024"),
    (b"Connection", b"keep-alive, X-Secret"),
    (b"X-Secret", b"s"),
    (b"Keep-Alive", b"timeout=5"),
    (b"Proxy-Authenticate", b"Basic"),
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


@pytest.mark.parametrize("value", [b"keep-alive", b"Keep-Alive", b"close", b"X-Secret", b"te"])
def test_a_single_connection_token_removes_what_it_names_and_nothing_else(value: bytes) -> None:
    """One token (the common ``keep-alive`` takes a shortcut): the header it names goes, the
    rest stays, exactly as with the token in a list."""
    raw = [(b"Connection", value), (b"Close", b"c"), (b"X-Secret", b"s"), (b"Keep-Alive", b"5"),
           (b"TE", b"t"), (b"X-Other", b"o")]  # fmt: skip
    listed = [(b"Connection", value + b", x-unused"), *raw[1:]]
    got = response_headers(raw)
    assert got == response_headers(listed)
    names = {name for name, _ in got[0]}
    assert names == {b"close", b"x-secret", b"x-other"} - {value.lower()}


@pytest.mark.parametrize("value", [b"12x", b"-1", b"", b"1 2", b"2, 2", b"+2", b"\xd9\xa3"])
def test_a_content_length_that_is_not_one_run_of_digits_is_refused(value: bytes) -> None:
    """Not digits, negative, empty, a list, a sign, non-ASCII digits: refused (502)."""
    with pytest.raises(BadResponseHead, match="Content-Length"):
        response_headers([(b"Content-Length", value)])


def test_a_repeated_content_length_is_refused_even_when_equal() -> None:
    """Two Content-Length fields (equal or not) are refused, as nginx does."""
    for second in (b"2", b"3"):
        with pytest.raises(BadResponseHead, match="Content-Length"):
            response_headers([(b"Content-Length", b"2"), (b"content-length", second)])


def test_one_chunked_coding_is_decoded_and_its_header_dropped() -> None:
    """``Transfer-Encoding: chunked`` (any case) is the transport's to decode: dropped."""
    for value in (b"chunked", b"Chunked", b" CHUNKED"):
        raw = [(b"Transfer-Encoding", value), (b"etag", b"x")]
        assert response_headers(raw) == ([(b"etag", b"x")], None, False)


@pytest.mark.parametrize(
    "codings",
    [[b"chunked, gzip"], [b"gzip, chunked"], [b"gzip"], [b"identity"], [b"chunked", b"chunked"],
     [b"chunked", b"gzip"], [b"chunked,"], [b""]],
)  # fmt: skip
def test_any_other_transfer_coding_is_refused(codings: list[bytes]) -> None:
    """A coding the gateway would not decode (or chunked twice) is refused, never relayed raw."""
    raw = [(b"transfer-encoding", value) for value in codings]
    with pytest.raises(BadResponseHead, match="Transfer-Encoding"):
        response_headers(raw)


def test_content_length_with_transfer_encoding_is_refused() -> None:
    """Both framing headers at once (RFC 9112 6.3: a smuggling sign) are refused."""
    raw = [(b"content-length", b"10"), (b"transfer-encoding", b"chunked")]
    with pytest.raises(BadResponseHead, match="both"):
        response_headers(raw)


def test_the_field_count_and_byte_limits_are_inclusive() -> None:
    """``max_headers`` fields and ``max_bytes`` bytes pass; one more of either is refused."""
    raw = [(b"x-%d" % i, b"v") for i in range(10)]  # 10 fields, 40 bytes of names and values
    assert len(response_headers(raw, max_headers=10, max_bytes=40)[0]) == 10
    with pytest.raises(BadResponseHead, match="11 header fields"):
        response_headers([*raw, (b"y", b"")], max_headers=10)
    with pytest.raises(BadResponseHead, match="too big header"):
        response_headers(raw, max_headers=10, max_bytes=39)


@pytest.mark.parametrize("status", [0, 99, 100, 101, 103, 199, 600, 999, 1000])
def test_a_status_outside_200_599_is_refused(status: int) -> None:
    """Only final statuses 200-599 are relayed; 1xx never reach here except unasked (101)."""
    with pytest.raises(BadResponseHead, match="status"):
        response_head(status, [])


@pytest.mark.parametrize("status", [204, 304])
def test_no_content_statuses_lose_a_nonzero_length(status: int) -> None:
    """204/304 with Content-Length 5: the length goes (uvicorn would wait for 5 bytes); 0 stays."""
    raw = [(b"content-length", b"5"), (b"etag", b"x")]
    assert response_head(status, raw) == ([(b"etag", b"x")], 0, False)
    zero = [(b"content-length", b"0")]
    assert response_head(status, zero) == ([(b"content-length", b"0")], 0, False)
    assert response_head(200, raw) == ([(b"content-length", b"5"), (b"etag", b"x")], 5, False)


def test_connection_naming_content_length_keeps_the_framing() -> None:
    """``Connection: content-length`` is ignored on the response side too (framing is never
    a hop-by-hop header, as nginx); a token naming an ordinary header still removes it."""
    raw = [(b"content-length", b"5"), (b"connection", b"Content-Length, etag"), (b"etag", b"x")]
    assert response_headers(raw) == ([(b"content-length", b"5")], 5, False)


@pytest.mark.parametrize("value", [b"a\x00b", b"a\x01b", b"a\x0bb", b"a\x1fb", b"a\x7fb"])
def test_a_control_character_in_a_value_is_refused_when_asked(value: bytes) -> None:
    """CTLs other than HTAB (uvicorn raises on them) are refused with ``controls``; HTAB and
    obs-text pass; without ``controls`` (the lean parser checked) nothing is looked at."""
    with pytest.raises(BadResponseHead, match="control character"):
        response_headers([(b"x-a", value)], controls=True)
    assert response_headers([(b"x-a", value)])[0] == [(b"x-a", value)]
    for fine in (b"a\tb", b"caf\xe9"):
        assert response_headers([(b"x-a", fine)], controls=True)[0] == [(b"x-a", fine)]

"""Raw-socket helpers for proxy tests where the bytes matter (issue 11, issue 13)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    """One parsed HTTP/1.1 response: status, raw header list, body (dechunked)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    #: False when the connection closed before the framing said the body was complete.
    complete: bool = True

    def header(self, name: bytes) -> list[bytes]:
        """Every value of ``name`` (case-insensitive), in order."""
        return [v for k, v in self.headers if k.lower() == name.lower()]


def exchange(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data`` to 127.0.0.1:port and read until the server closes (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def parse_responses(data: bytes, head_only: bool = False) -> list[RawResponse]:
    """Split a byte stream into the responses it holds (Content-Length, chunked or close)."""
    out: list[RawResponse] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            raise AssertionError(f"truncated response head: {data[:200]!r}")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = [tuple(x.strip() for x in line.split(b":", 1)) for line in lines[1:]]
        response = RawResponse(status, headers, b"")  # type: ignore[arg-type]
        data = _body(response, rest, head_only or status in (204, 304) or status < 200)
        out.append(response)
    return out


def _body(response: RawResponse, rest: bytes, empty: bool) -> bytes:
    if empty:
        return rest
    if b"chunked" in b",".join(response.header(b"transfer-encoding")).lower():
        return _chunked(response, rest)
    lengths = response.header(b"content-length")
    if lengths:
        n = int(lengths[0])
        response.body, response.complete = rest[:n], len(rest) >= n
        return rest[n:]
    response.body = rest
    return b""


def _chunked(response: RawResponse, rest: bytes) -> bytes:
    body = bytearray()
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            response.body, response.complete = bytes(body), False
            return b""
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            _, _, rest = rest.partition(b"\r\n")  # no trailers in these tests
            response.body = bytes(body)
            return rest
        if len(rest) < size + 2:
            response.body, response.complete = bytes(body + rest[:size]), False
            return b""
        body += rest[:size]
        rest = rest[size + 2 :]


@dataclass
class CountingListener:
    """A TCP listener on loopback that counts (and closes) every connection it accepts."""

    port: int = 0
    accepted: int = 0
    _sock: socket.socket = field(default_factory=socket.socket)
    _thread: threading.Thread | None = None

    def start(self) -> CountingListener:
        """Listen on a free port and accept in a daemon thread."""
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nstolen")
            conn.close()

    def stop(self) -> None:
        """Close the listening socket (the thread ends)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._sock.close()
        if self._thread is not None:
            self._thread.join(5)


class ResettingListener(CountingListener):
    """Accepts, reads the request head, then resets the connection (RST): counts attempts."""

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            with contextlib.suppress(OSError):
                conn.settimeout(5)
                conn.recv(65536)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()


def read_request(conn: socket.socket) -> bytes:
    """One request head plus its Content-Length body (or chunked body to the last chunk)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        while not rest.endswith(b"\r\n\r\n") or b"0\r\n" not in rest:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
    elif b"content-length:" in lower:
        n = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        while len(rest) < n:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
    return head + b"\r\n\r\n" + rest


class ScriptedUpstream(CountingListener):
    """Each accepted connection is handed to ``script(conn, index)`` in its own thread."""

    def __init__(self, script: Callable[[socket.socket, int], None]) -> None:
        super().__init__()
        self.script = script
        self.requests: list[bytes] = []

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn, self.accepted), daemon=True).start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            self.script(conn, index)

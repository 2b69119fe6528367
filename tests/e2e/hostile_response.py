"""A raw-socket upstream with scripted (hostile) answers and an h11 client that pipelines.

``HostileUpstream`` answers ``GET /h/<key>`` with the bytes registered under
``key`` (then keeps the connection or closes it, as registered) and
``GET /second`` with ``GOOD``, on any connection, so that a pooled connection
the gateway reuses after a hostile answer shows what it carries.
``pipelined`` sends ``GET /h/<key>`` and ``GET /second`` in one write on one
client connection and parses what comes back with h11, as a client would.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

import h11

from tests.e2e.raw_http import CountingListener

GOOD_BODY = b"good"
GOOD = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n" + GOOD_BODY
#: How long the client waits for the gateway's bytes (a hang fails the test, after this).
CLIENT_TIMEOUT_S = 10.0


class HostileUpstream(CountingListener):
    """Answers ``/h/<key>`` with ``answers[key]`` and ``/second`` with ``GOOD``."""

    def __init__(self) -> None:
        super().__init__()
        #: key -> (bytes to send, close the connection after them).
        self.answers: dict[str, tuple[bytes, bool]] = {}
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        #: The request paths each upstream connection carried, in order.
        self.served: list[list[str]] = []

    def answer(self, key: str, data: bytes, close: bool = True) -> str:
        """Register ``data`` as the answer to ``GET /h/<key>``; returns the path."""
        self.answers[key] = (data, close)
        return f"/h/{key}"

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            with self._lock:
                self._conns.append(conn)
                self.served.append([])
                paths = self.served[-1]
            threading.Thread(target=self._serve, args=(conn, paths), daemon=True).start()

    def _serve(self, conn: socket.socket, paths: list[str]) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode("latin-1")
                paths.append(path)
                if path.startswith("/h/"):
                    data, close = self.answers[path[3:]]
                else:
                    data, close = GOOD, False
                conn.sendall(data)
                if close:
                    return

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        super().stop()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.close()


@dataclass
class Answer:
    """One response as the client parsed it (``complete`` False: the connection was cut)."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False

    def header(self, name: bytes) -> list[bytes]:
        """Every value of ``name``."""
        return [v for k, v in self.headers if k == name.lower()]


@dataclass
class Exchange:
    """Both answers of a pipelined pair, and any bytes after them."""

    first: Answer
    second: Answer | None
    #: The connection was cut (abort or close) before both answers were complete.
    cut: bool = False
    #: h11 found the stream malformed (a desynchronised or broken connection).
    malformed: str = ""


def _request(path: str, method: str = "GET") -> h11.Request:
    return h11.Request(method=method, target=path, headers=[("Host", "gw")])


def pipelined(port: int, path: str, method: str = "GET") -> Exchange:
    """``method path`` then ``GET /second``, written at once; both answers parsed by h11."""
    client = h11.Connection(h11.CLIENT)
    first_req = client.send(_request(path, method)) + client.send(h11.EndOfMessage())
    second_bytes = b"GET /second HTTP/1.1\r\nHost: gw\r\n\r\n"
    answers: list[Answer] = [Answer()]
    out = Exchange(answers[0], None)
    eof = False
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall((first_req or b"") + second_bytes)
        while True:
            try:
                event = client.next_event()
            except h11.RemoteProtocolError as exc:
                if eof and "peer closed" in str(exc):
                    out.cut = True  # an abort mid-body: the truncation is visible, fine
                else:
                    out.malformed = str(exc)
                return out
            if event is h11.NEED_DATA:
                try:
                    data = sock.recv(65536)
                except (ConnectionResetError, TimeoutError) as exc:
                    if isinstance(exc, TimeoutError):
                        out.malformed = "timed out waiting for the gateway"
                    data = b""
                eof = not data
                client.receive_data(data)
                continue
            current = answers[-1]
            if isinstance(event, h11.Response):
                current.status = event.status_code
                current.headers = [(k, v) for k, v in event.headers]
            elif isinstance(event, h11.Data):
                current.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                current.complete = True
                if len(answers) == 2:
                    return out
                if client.our_state is h11.MUST_CLOSE or client.their_state is h11.MUST_CLOSE:
                    out.cut = True  # the gateway closes after this answer: fine, no second
                    return out
                client.start_next_cycle()
                client.send(_request("/second"))
                client.send(h11.EndOfMessage())
                answers.append(Answer())
                out.second = answers[1]
            elif isinstance(event, h11.ConnectionClosed):
                out.cut = True
                return out
            # InformationalResponse: a client skips it (counted by nothing)


__all__ = ["GOOD", "GOOD_BODY", "Answer", "Exchange", "HostileUpstream", "pipelined"]

"""Raw-socket HTTP for tests where the bytes matter (no client library in between)."""

from __future__ import annotations

import socket

from prometheus_client.parser import text_string_to_metric_families


def exchange(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as is on a fresh connection; everything until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def get(port: int, path: str, headers: dict[str, str] | None = None) -> bytes:
    """A one-shot ``GET`` with ``Connection: close`` and the given headers, raw."""
    lines = [f"GET {path} HTTP/1.1", "Host: gw", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def status_of(response: bytes) -> int:
    """The status code of a raw response."""
    return int(response.split(b" ", 2)[1])


def header_values(response: bytes, name: bytes) -> list[bytes]:
    """Every value of header ``name`` in a raw response head."""
    head = response.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
    out = []
    for line in head:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower():
            out.append(value.strip())
    return out


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0.0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0

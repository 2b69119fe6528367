"""uvicorn in a thread with any settings (lifespan on by default), stopped on exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.e2e.support import free_port


@contextmanager
def serving(app: Any, **kw: Any) -> Iterator[int]:
    """Serve ``app`` on a free loopback port with uvicorn settings ``kw``; yields the port."""
    port = free_port()
    settings: dict[str, Any] = {"log_level": "critical", "lifespan": "on", **kw}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    limit = time.monotonic() + 10
    while not server.started:  # readiness poll, bounded
        assert time.monotonic() < limit and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)

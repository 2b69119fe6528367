"""uvicorn in a thread with any settings (lifespan on by default), stopped on exit.

``serving`` runs one server; ``servers`` a group of them that stop together: a
uvicorn server takes about 0.1 s to stop (its shutdown gives connections 0.1 s
to close; ``support.ThreadServer`` starts it at once), and a group pays that
once instead of once per server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.e2e.support import HANG_S, ThreadServer, free_port


class Servers:
    """uvicorn servers in threads, each started (and ready) on its own, stopped together."""

    def __init__(self) -> None:
        self.running: list[tuple[ThreadServer, threading.Thread]] = []

    def start(self, app: Any, **kw: Any) -> int:
        """Serve ``app`` on a free loopback port with uvicorn settings ``kw``; its port."""
        port = free_port()
        settings: dict[str, Any] = {"log_level": "critical", "lifespan": "on", **kw}
        server = ThreadServer(uvicorn.Config(app, host="127.0.0.1", port=port, **settings))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        self.running.append((server, thread))
        limit = time.monotonic() + HANG_S
        while not server.started:  # readiness poll, bounded
            assert time.monotonic() < limit and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        return port

    def stop(self) -> None:
        """Ask every server to exit, then wait for each (a graceful uvicorn shutdown)."""
        running, self.running = self.running, []
        for server, _ in running:
            server.stop()
        for _, thread in running:
            thread.join(HANG_S)


@contextmanager
def servers() -> Iterator[Servers]:
    """A group of servers (``start`` each), all stopped together on exit."""
    group = Servers()
    try:
        yield group
    finally:
        group.stop()


@contextmanager
def serving(app: Any, **kw: Any) -> Iterator[int]:
    """Serve ``app`` on a free loopback port with uvicorn settings ``kw``; yields the port."""
    with servers() as group:
        yield group.start(app, **kw)

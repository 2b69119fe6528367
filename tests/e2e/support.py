"""Helpers for tests that run real servers on loopback (bounded readiness polls, PID stops)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn

T = TypeVar("T")

#: The bound of every readiness or condition poll on a real server, process or thread: a
#: hang guard, not a speed assumption. Only a hang waits it out; a loaded shared machine
#: can take tens of seconds to start a process (a 10 s bound failed CI that way; the
#: ``--workers 2`` gateway took over 60 s at nice 10 under a load average of 8).
HANG_S = 120.0

#: How long one readiness poll waits for its answer. A server that accepts but answers
#: slowly (the ``--workers`` supervisor asks every worker for /health) is still starting:
#: at 0.5 s a loaded machine never saw an answer in 120 s of polls.
POLL_S = 5.0

#: Environment that makes the gateway read only the config file it is given.
NO_BALLAST_ENV = {"BALLAST_UPSTREAM": "", "BALLAST_LIMITER": "", "BALLAST_FIXED_LIMIT": ""}


#: Sockets that hold the ports ``free_port`` handed out until the test ends
#: (``release_ports``, an autouse fixture in ``tests/conftest.py``).
_RESERVED: list[socket.socket] = []


def free_port() -> int:
    """An unused loopback port, reserved for the test's own server until the test ends.

    The port stays bound (``SO_REUSEADDR``, not listening) by a socket of ours: the
    kernel then neither hands it out to another ``bind(0)`` nor uses it as a client's
    ephemeral port (``connect``), so no other suite on a shared machine can take it
    between this call and our server's bind. Our servers (uvicorn, the ``ballast`` CLI,
    the simulator, redis, etcd, nginx, HAProxy) bind with ``SO_REUSEADDR`` too, which
    Linux allows next to a bound socket that does not listen.
    """
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _RESERVED.append(s)
    return int(s.getsockname()[1])


def release_ports() -> None:
    """Close every reservation ``free_port`` made (once the test's servers are stopped)."""
    while _RESERVED:
        _RESERVED.pop().close()


class ThreadServer(uvicorn.Server):
    """uvicorn's server for a test's thread: ``stop()`` wakes its main loop at once, where
    uvicorn's looks at ``should_exit`` only every 0.1 s; the rest (start-up, the ticks, the
    graceful shutdown) is uvicorn's own."""

    _loop: asyncio.AbstractEventLoop | None = None
    _wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        """uvicorn's main loop (``on_tick`` every 0.1 s until it says exit), woken by ``stop``."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    def stop(self) -> None:
        """Ask the server to exit (from any thread); it starts its shutdown at once."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: it has stopped
                loop.call_soon_threadsafe(wake.set)


def serve_in_thread(
    app: Any, port: int, lifespan: str = "off"
) -> tuple[ThreadServer, threading.Thread]:
    """Run ``app`` on uvicorn in a thread; return once it accepts connections."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan
    )
    server = ThreadServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    limit = time.monotonic() + HANG_S
    while not server.started:  # readiness poll, bounded
        assert time.monotonic() < limit and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    return server, thread


def stop_thread(server: uvicorn.Server, thread: threading.Thread) -> None:
    """Stop a server started by ``serve_in_thread``."""
    if isinstance(server, ThreadServer):
        server.stop()
    else:
        server.should_exit = True
    thread.join(HANG_S)


@contextmanager
def thread_servers() -> Iterator[Any]:
    """A ``start(app) -> port`` that serves apps on uvicorn threads (lifespan on); all
    stopped together on exit (a uvicorn stop polls for about 0.2 s: paid once)."""
    running: list[tuple[ThreadServer, threading.Thread]] = []

    def start(app: Any) -> int:
        port = free_port()
        running.append(serve_in_thread(app, port, lifespan="on"))
        return port

    try:
        yield start
    finally:
        for server, _ in running:
            server.stop()
        for server, thread in running:
            stop_thread(server, thread)


def wait_http(url: str, proc: subprocess.Popen[bytes], seconds: float = HANG_S) -> None:
    """Poll ``url`` until it answers, failing early if ``proc`` exits."""
    limit = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, proc.communicate()[1].decode()
        try:
            httpx.get(url, timeout=POLL_S)
            return
        except httpx.TransportError:
            assert time.monotonic() < limit, f"{url} never answered"
            time.sleep(0.05)  # readiness poll, bounded


def no_drain(tmp: Path) -> Path:
    """A config file with only ``server.drain_grace_ms: 0``: a ``ballast`` CLI given it (flags
    for the rest) ends at SIGTERM at once instead of 5 s of health 503 first (the drain
    itself is ``test_drain_e2e.py``'s)."""
    path = tmp / "no-drain.yaml"
    path.write_text("server: {drain_grace_ms: 0}\n")
    return path


def enter_together(stack: ExitStack, managers: Sequence[AbstractContextManager[T]]) -> list[T]:
    """Enter ``managers`` at once (each in its own thread: process start-ups and readiness
    polls overlap) and exit them at once when ``stack`` closes; their values, in order. The
    first failure to enter is raised once every other has entered (and is registered)."""
    with ThreadPoolExecutor(max_workers=max(1, len(managers))) as pool:
        futures = [pool.submit(m.__enter__) for m in managers]
    values: list[T] = []
    entered: list[AbstractContextManager[T]] = []
    error: BaseException | None = None
    for manager, future in zip(managers, futures, strict=True):
        try:
            values.append(future.result())
        except BaseException as exc:  # raised below, once the others are registered
            error = error or exc
            continue
        entered.append(manager)

    def exit_all(*exc_info: Any) -> bool:
        with ThreadPoolExecutor(max_workers=max(1, len(entered))) as pool:
            exits = [pool.submit(m.__exit__, *exc_info) for m in entered]
        for done in exits:
            done.result()  # the first error of a stop, after every stop has run
        return False

    stack.push(exit_all)
    if error is not None:
        raise error
    return values


def stop_process(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM by PID, wait (closing the pipes), SIGKILL if it hangs; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode


@contextmanager
def uvicorn_gateway(config: Path, ready_s: float = HANG_S) -> Iterator[tuple[str, int]]:
    """``uvicorn ballast_asgi.gateway:app`` with ``BALLAST_CONFIG=config``: (base URL, PID)."""
    port = free_port()
    env = {**os.environ, "BALLAST_CONFIG": str(config), **NO_BALLAST_ENV}
    args = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/_ballast/health", proc, ready_s)
        yield base, proc.pid
    finally:
        stop_process(proc)

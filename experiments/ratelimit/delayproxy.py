"""A small TCP proxy that delays every chunk by a fixed time (a slow Redis, on loopback).

Runs its own asyncio loop in a daemon thread. Requests pass at once; replies
(server to client) are forwarded ``delay_s`` after they arrive, in order, so
each round trip costs ``delay_s`` more and pipelining still works.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from experiments._harness.procs import free_port


class DelayProxy:
    """``127.0.0.1:port`` -> ``127.0.0.1:target_port`` with replies delayed by ``delay_s``."""

    def __init__(self, target_port: int, delay_s: float, port: int | None = None) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = port or free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """A ``redis://`` URL pointing at the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> DelayProxy:
        """Start the loop thread; return once the proxy listens."""
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("delay proxy did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then stop the loop thread."""
        if self._loop.is_running():
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            with contextlib.suppress(Exception):
                done.result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        if self._server is not None:
            await self._server.wait_closed()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                return
            self._writers.add(up_writer)
            await asyncio.gather(
                _pipe(reader, up_writer, 0.0),
                _pipe(up_reader, writer, self.delay_s),
                return_exceptions=True,
            )
        finally:
            writer.close()
            self._handlers.discard(task)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy ``src`` to ``dst``, each chunk ``delay_s`` after it arrived (order kept)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def writer() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            dst.write(data)
            await dst.drain()

    task = loop.create_task(writer())
    try:
        while data := await src.read(65536):
            queue.put_nowait((loop.time() + delay_s, data))
    finally:
        queue.put_nowait((loop.time() + delay_s, b""))
        with contextlib.suppress(Exception):
            await task
        dst.close()

"""Run ``ballast --workers N``: fork the workers, restart the dead ones, serve the admin port.

See ``ballast_asgi.server.workers`` for what is divided and what is merged.

**Supervision.** The parent keeps the traffic socket open and watches its
children (``SIGCHLD``, reaped with ``waitpid(WNOHANG)``). A worker that exits
while the parent is not stopping is logged (``worker.died``: index, PID, exit
code or signal) and forked again on the same shared socket after a back-off
(``RESTART_BASE_S`` doubling per restart in the last ``CRASH_WINDOW_S``, at
most ``RESTART_MAX_S``), then logged again (``worker.restarted``). More than
``CRASH_LIMIT`` restarts of one slot within ``CRASH_WINDOW_S`` is a crash
loop: the slot is given up (``worker.crash_loop``, error) and the others serve
on; when every slot is given up the supervisor exits with status 1. Caps are
not re-divided while a worker is missing: each keeps its ``1/N`` share (a
restart takes well under a second), so the gateway-wide caps are never
exceeded. A given-up slot never returns: with ``workers.redivide_on_loss`` the
supervisor writes the live count to ``SHARE_FILE`` in its private directory
and sends each live worker SIGUSR1; the worker's gateway reloads with the
reloadable caps divided by that count (``Gateway.redivide``), and a worker
that starts later reads the file at start-up. Until its gateway handles
SIGUSR1 a worker ignores it (never killed by it).

**The admin port keeps answering** what the live workers report
(``ballast_asgi.server.worker_admin``):
``/metrics`` merges theirs (200) and adds ``ballast_worker_up{worker}`` and
``ballast_worker_restarts_total{worker}``; ``/snapshot`` lists the live
workers and, under ``missing``, each absent one and why; ``/health`` is the
worst of the live workers', ``degraded`` (200) with a reason per missing
worker, 503 only when none answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import uvicorn

from ballast_asgi.server.serve import QuietServer
from ballast_asgi.server.worker_admin import Aggregator, Slot
from ballast_asgi.server.workers import SHARE_FILE
from ballast_asgi.telemetry.events import emit

__all__ = ["Aggregator", "Supervisor", "run_workers"]

#: Runs one worker's servers on (traffic socket, admin Unix socket) until it is told to stop.
WorkerFn = Callable[[int, socket.socket, socket.socket], None]
RESTART_BASE_S = 0.1
RESTART_MAX_S = 5.0
CRASH_LIMIT = 5
CRASH_WINDOW_S = 60.0


def share_path(worker_admin: socket.socket) -> str:
    """In a worker: the supervisor's live-worker file (beside its admin Unix socket)."""
    return os.path.join(os.path.dirname(worker_admin.getsockname()), SHARE_FILE)


def backoff_s(recent_restarts: int) -> float:
    """Delay before the next restart of a slot that restarted ``recent_restarts`` times."""
    return min(RESTART_MAX_S, RESTART_BASE_S * 2.0 ** max(0, recent_restarts))


def exit_text(status: int) -> str:
    """``exit 1`` or ``signal SIGKILL`` from a ``waitpid`` status."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit {code}"


#: ``prctl(2)`` option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGTERM this worker when the supervisor dies, even by SIGKILL.

    A worker runs in its own process group, so a signal to the supervisor's
    group does not reach it; without this, a supervisor killed by the OOM
    killer or ``kill -9`` would leave its workers serving on, unsupervised.
    SIGTERM lets the worker drain as on a normal stop. Linux only; elsewhere
    a no-op. A parent that already died before the call ends the worker too.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def _forget_parent_loop() -> None:
    """In a worker forked from the running supervisor loop: drop its loop and signals."""
    asyncio.events._set_running_loop(None)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)


class Supervisor:
    """Forks, watches and restarts the workers of one ``ballast --workers N``."""

    def __init__(
        self,
        workers: int,
        traffic: socket.socket,
        run: WorkerFn,
        tmp: str,
        *,
        redivide: bool = False,
    ) -> None:
        self.traffic = traffic
        #: ``workers.redivide_on_loss``: a given-up slot's share goes to the live workers.
        self.redivide = redivide
        self.share_path = os.path.join(tmp, SHARE_FILE)
        self.run = run
        self.parent = os.getpid()
        self.slots = [Slot(i, os.path.join(tmp, f"worker-{i}.sock")) for i in range(workers)]
        self.stopping = False
        self.codes: dict[int, int] = {}
        #: Sockets a worker must not hold (the admin port is the parent's).
        self.close_in_child: list[socket.socket] = []
        #: Called once every slot has exited or been given up.
        self.on_all_done: Callable[[], None] = lambda: None

    def fork(self, slot: Slot) -> None:
        """Start ``slot``'s worker (a fresh admin socket, the shared traffic socket)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slot.path)
        admin = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        admin.bind(slot.path)
        admin.listen(64)
        pid = os.fork()
        if pid == 0:  # the worker, in its own process group: signals come from the parent only
            code = 0
            try:
                os.setpgid(0, 0)
                _die_with_parent(self.parent)
                _forget_parent_loop()
                signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until the gateway handles it
                for sock in self.close_in_child:
                    sock.close()
                self.run(slot.index, self.traffic, admin)
            except BaseException:  # a worker must never return into the parent's code
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        admin.close()
        slot.pid, slot.state = pid, "starting"

    def reap(self, loop: asyncio.AbstractEventLoop) -> None:
        """Collect every exited child; restart or give up on its slot."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            slot = next((s for s in self.slots if s.pid == pid), None)
            if slot is not None:
                self._exited(slot, status, loop)
        if all(s.state in ("exited", "given_up") for s in self.slots):
            self.on_all_done()

    def _exited(self, slot: Slot, status: int, loop: asyncio.AbstractEventLoop) -> None:
        slot.last_exit = exit_text(status)
        self.codes[slot.index] = os.waitstatus_to_exitcode(status)
        if self.stopping:
            slot.state = "exited"
            return
        now = time.monotonic()
        slot.restarts = [t for t in slot.restarts if now - t < CRASH_WINDOW_S]
        if len(slot.restarts) >= CRASH_LIMIT:
            slot.state = "given_up"
            emit("worker.crash_loop", "error", key=str(slot.index), worker=slot.index,
                 pid=slot.pid, exit=slot.last_exit, restarts=len(slot.restarts),
                 window_s=CRASH_WINDOW_S)  # fmt: skip
            if self.redivide:
                self.redivide_caps()
            return
        delay = backoff_s(len(slot.restarts))
        slot.state = "restarting"
        emit("worker.died", "error", key=str(slot.index), worker=slot.index, pid=slot.pid,
             exit=slot.last_exit, restart_in_s=delay)  # fmt: skip
        slot.restarts.append(now)
        loop.call_later(delay, self._restart, slot)

    def redivide_caps(self) -> None:
        """Write the live-worker count and tell each live worker (SIGUSR1) to re-divide."""
        live = [s for s in self.slots if s.state != "given_up"]
        if not live:
            return
        tmp = self.share_path + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(str(len(live)))
        os.replace(tmp, self.share_path)  # a worker never reads half a number
        emit("worker.caps_redivided", "warning", key="supervisor", live=len(live),
             of=len(self.slots))  # fmt: skip
        for slot in live:  # a restarting one reads the file when it starts
            if slot.pid is not None and slot.state in ("running", "starting"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signal.SIGUSR1)

    def _restart(self, slot: Slot) -> None:
        if self.stopping or slot.state != "restarting":
            return
        old = slot.pid
        try:
            self.fork(slot)
        except OSError as exc:  # e.g. EAGAIN: no process slot now; try again later
            emit("worker.restart_failed", "error", key=str(slot.index), worker=slot.index,
                 error=str(exc), retry_in_s=RESTART_MAX_S)  # fmt: skip
            asyncio.get_running_loop().call_later(RESTART_MAX_S, self._restart, slot)
            return
        emit("worker.restarted", "info", key=str(slot.index), worker=slot.index, pid=slot.pid,
             previous_pid=old, restarts=len(slot.restarts))  # fmt: skip

    def forward(self, sig: int) -> None:
        """Pass a signal to every live worker; SIGTERM/SIGINT also stop the restarts."""
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
            for slot in self.slots:
                if slot.state == "restarting":
                    slot.state = "exited"
            if all(s.state in ("exited", "given_up") for s in self.slots):
                self.on_all_done()  # nothing left running to wait for
        for slot in self.slots:
            if slot.pid is not None and slot.state in ("running", "starting"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, sig)

    def exit_code(self) -> int:
        """1 when a slot was given up, else the worst worker exit code."""
        if any(s.state == "given_up" for s in self.slots):
            return 1
        return max(self.codes.values(), default=0)


def run_workers(
    workers: int,
    traffic: socket.socket,
    admin: socket.socket | None,
    run: WorkerFn,
    settings: dict[str, Any],
    *,
    redivide: bool = False,
) -> int:
    """Fork ``workers`` processes serving ``traffic``; supervise them and serve ``admin``."""
    tmp = tempfile.mkdtemp(prefix="ballast-workers-")
    sup = Supervisor(workers, traffic, run, tmp, redivide=redivide)
    if admin is not None:
        sup.close_in_child.append(admin)
    try:
        for slot in sup.slots:
            sup.fork(slot)
        pids = ", ".join(str(s.pid) for s in sup.slots)
        print(f"ballast: {workers} workers, PIDs {pids}", file=sys.stderr, flush=True)
        asyncio.run(_parent(sup, admin, settings))
    finally:
        traffic.close()
        for path in [s.path for s in sup.slots] + [sup.share_path]:
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(tmp)
    return sup.exit_code()


async def _parent(sup: Supervisor, admin: socket.socket | None, settings: dict[str, Any]) -> None:
    """Forward signals, restart dead workers, serve the aggregated admin port until all exit."""
    loop = asyncio.get_running_loop()
    finished = asyncio.Event()
    sup.on_all_done = finished.set
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, sup.forward, sig)
    loop.add_signal_handler(signal.SIGCHLD, sup.reap, loop)
    sup.reap(loop)  # a worker that died before the handler was installed
    app = Aggregator(sup.slots)
    server = QuietServer(uvicorn.Config(app, lifespan="on", **settings)) if admin else None
    serving = (
        asyncio.ensure_future(server.serve(sockets=[admin]))
        if server is not None and admin is not None
        else None
    )
    await finished.wait()
    if server is not None and serving is not None:
        server.should_exit = True
        await serving

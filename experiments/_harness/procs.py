"""Child processes for the tools: free ports, start (optionally pinned), stop by PID.

``terminate(proc)`` / ``kill(proc)`` stop one child by PID (SIGTERM then
SIGKILL / SIGKILL at once). ``Procs.start`` runs a command with ``taskset -c
CPU`` (which execs into the command, so the Popen pid is the measured process)
in its own session (Ctrl-C reaches only the tool), output to
``<dir>/<log>.log``, and waits (bounded) until it accepts on its port.
``Procs.stop_all`` (or leaving ``processes()``) stops every child by PID:
SIGTERM, wait, SIGKILL if it does not exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 8.0
#: How long a SIGKILLed child may take to exit: a hang guard (a child pinned to a CPU
#: another session keeps busy at a higher priority took over 5 s).
KILLED_EXIT_S = 60.0
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def free_port() -> int:
    """An unused loopback TCP port."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes] | None, timeout_s: float = 60.0) -> None:
    """Poll until something accepts on ``port``; fail fast if ``proc`` died.

    The bound is a hang guard: a loaded shared machine can take tens of seconds to
    start a Python process.
    """
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {HOST}:{port} after {timeout_s} s")


@dataclass
class Procs:
    """Starts child processes (pinned when asked) and stops every one of them by PID."""

    tmp: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(
        self,
        cmd: list[str],
        cpu: int | None,
        port: int | None,
        log: str,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run ``cmd`` (pinned to ``cpu`` unless None) and wait until it listens on ``port``.

        ``env`` adds to (does not replace) this process's environment.
        """
        argv = cmd if cpu is None else ["taskset", "-c", str(cpu), *cmd]
        # The child keeps its own copy of the descriptor: close ours at once.
        with open(self.tmp / f"{log}.log", "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **env} if env else None,
            )
        self.started.append(proc)
        if port is not None:
            try:
                wait_port(port, proc)
            except RuntimeError:
                print(self.log_tail(log), file=sys.stderr)
                raise
        return proc

    def log_tail(self, log: str, n_bytes: int = 2000) -> str:
        """The end of a child's output."""
        path = self.tmp / f"{log}.log"
        return path.read_bytes()[-n_bytes:].decode(errors="replace") if path.exists() else ""

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM ``proc`` by PID, wait, SIGKILL if it does not exit."""
        terminate(proc)
        if proc in self.started:
            self.started.remove(proc)

    def stop_all(self) -> None:
        """Stop everything still running, newest first (SIGINT/SIGTERM held off meanwhile).

        One stop that fails (a child starved of CPU outlives its waits) does not
        leave the others running: each is stopped, then the first failure is raised.
        """
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        failed: BaseException | None = None
        try:
            for proc in reversed(list(self.started)):
                try:
                    self.stop(proc)
                except Exception as exc:  # raised below, once every other is stopped
                    failed = failed or exc
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if failed is not None:
            raise failed


def terminate(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM ``proc`` by PID, wait up to ``timeout_s``, SIGKILL if it has not exited."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill(proc)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` by PID at once and reap it (an outage, not a shutdown)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(KILLED_EXIT_S)


def stop_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so a tool's ``finally`` stops its children.

    For the synchronous tools. A tool started in the background by a
    non-interactive shell inherits SIGINT as *ignored*, and SIGTERM would end
    Python without unwinding: either way the children (in their own sessions)
    would outlive it. ``Procs.stop_all`` holds both signals off while it stops.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def cancel_on_signals() -> None:
    """In a running coroutine: SIGTERM and SIGINT cancel it (its ``finally`` blocks run)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, task.cancel)


@contextlib.contextmanager
def processes(tmp: Path) -> Iterator[Procs]:
    """A ``Procs`` whose processes are all stopped by PID on exit (also on errors)."""
    procs = Procs(tmp)
    try:
        yield procs
    finally:
        procs.stop_all()

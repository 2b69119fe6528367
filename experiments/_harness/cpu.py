"""CPU pinning and the /proc counters the tools measure with (Linux).

``pin_self`` pins the calling process (the generator) to one CPU (``scheduling_kept``
undoes that, and ``favour``, for a ``main`` called in-process); the other
processes are pinned at start by ``Procs.start(cmd, cpu, ...)``. ``cpu_s`` is
a process's user + system seconds, ``cpu_ticks``/``busy_share`` how busy each
CPU was (any process), ``status_kb`` a ``kB`` field of ``/proc/<pid>/status``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def can_pin() -> bool:
    """True when the machine has more than one CPU and affinity can be set."""
    return hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1


def pin_self(cpu: int) -> None:
    """Pin this process to ``cpu`` when the machine has more than one."""
    if can_pin():
        os.sched_setaffinity(0, {cpu})


#: The nice value ``favour`` asks for: CFS gives a nice -20 entity about 87 times the weight
#: of a nice-0 one (and 800 times a nice-10 one), so a neighbour's work on a shared machine
#: takes about 1 % of a CPU we are busy on instead of half of it.
FAVOURED_NICE = -20


def favour(pid: int = 0, nice: int = FAVOURED_NICE) -> int:
    """Lower ``pid``'s nice value and its autogroup's (0: this process); return the nice held.

    With ``kernel.sched_autogroup_enabled`` (this machine) every session is its
    own scheduling group and a process's nice only ranks it within its group;
    groups share a CPU by the group's nice (``/proc/<pid>/autogroup``), so both
    are set. Our children start their own sessions (``Procs.start``), so each
    is favoured after it starts. Without the privilege (not root, no
    CAP_SYS_NICE) nothing changes and the current value is returned.
    """
    with suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    with suppress(OSError):
        Path(f"/proc/{pid or 'self'}/autogroup").write_text(str(nice))
    return os.getpriority(os.PRIO_PROCESS, pid)


@contextmanager
def realtime(priority: int = 1) -> Iterator[str]:
    """Run the block at ``SCHED_FIFO`` ``priority``; yield the policy actually held.

    The generator shares CPU 0 with the simulator; under the default policy a
    wake-up at a request's intended time can wait a scheduler slice behind the
    simulator (several ms). At ``SCHED_FIFO`` it preempts any normal task at
    once. ``SCHED_RESET_ON_FORK`` keeps processes started inside the block at
    the default policy, and the kernel's real-time throttling (95 % of each
    second by default) bounds what a runaway generator could take. Without the
    privilege (not root, no ``CAP_SYS_NICE``) the block runs unchanged and the
    yielded text says so.
    """
    if not hasattr(os, "sched_setscheduler"):
        yield "SCHED_OTHER (no sched_setscheduler here)"
        return
    before = os.sched_getscheduler(0)
    try:
        policy = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
        os.sched_setscheduler(0, policy, os.sched_param(priority))
    except PermissionError:
        yield "SCHED_OTHER (SCHED_FIFO not permitted)"
        return
    try:
        yield f"SCHED_FIFO {priority}"
    finally:
        os.sched_setscheduler(0, before, os.sched_param(0))


def autogroup_nice(pid: int = 0) -> int | None:
    """The nice of ``pid``'s autogroup (0: this process); None without autogroups."""
    try:
        text = Path(f"/proc/{pid or 'self'}/autogroup").read_text()
    except OSError:
        return None
    return parse_autogroup(text)


def parse_autogroup(text: str) -> int | None:
    """The nice in ``/proc/<pid>/autogroup``'s text (``/autogroup-42 nice 0``), else None.

    The file exists but is empty when the process's scheduling group is not an
    autogroup (a container's cgroup, or ``kernel.sched_autogroup_enabled=0`` on
    some kernels): that is "no autogroup", not an error.
    """
    words = text.split()
    if len(words) == 3 and words[1] == "nice":
        with suppress(ValueError):
            return int(words[2])
    return None


def scheduling() -> tuple[frozenset[int] | None, int, int | None]:
    """This thread's CPU affinity (None where it cannot be set), nice and autogroup nice."""
    cpus = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return cpus, os.getpriority(os.PRIO_PROCESS, 0), autogroup_nice()


@contextmanager
def scheduling_kept() -> Iterator[None]:
    """Give this thread back its CPU affinity, nice and autogroup nice on exit.

    A command's ``main`` pins itself (``pin_self``) and may ``favour`` itself
    for its whole life; called in-process (a test calls ``run.main([...])``) it
    would otherwise leave the caller, and every process the caller starts
    later, on one CPU at another nice.
    """
    cpus, nice, group = scheduling()
    try:
        yield
    finally:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        with suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        if group is not None:
            with suppress(OSError):
                Path("/proc/self/autogroup").write_text(str(group))


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> dict[int, tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            name, *vals = line.split()
            n = [int(v) for v in vals[:8]]
            idle = n[3] + n[4]
            out[int(name[3:])] = (sum(n) - idle, sum(n))
    return out


def steal_ticks() -> dict[int, int]:
    """Per CPU jiffies of *steal*: the hypervisor ran something else on our virtual CPU."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            fields = line.split()
            out[int(fields[0][3:])] = int(fields[8]) if len(fields) > 8 else 0
    return out


def steal_all(before: dict[int, int], ticks_before: dict[int, tuple[int, int]]) -> dict[str, float]:
    """Share of time each CPU was stolen by the hypervisor since ``before``."""
    now, ticks = steal_ticks(), cpu_ticks()
    out = {}
    for c in before:
        total = ticks[c][1] - ticks_before[c][1]
        out[str(c)] = round((now[c] - before[c]) / total, 4) if total else float("nan")
    return out


def busy_share(before: dict[int, tuple[int, int]], cpu: int) -> float:
    """Share of time ``cpu`` was busy (any process) since ``before``."""
    now = cpu_ticks()
    busy = now[cpu][0] - before[cpu][0]
    total = now[cpu][1] - before[cpu][1]
    return busy / total if total else float("nan")


def busy_all(before: dict[int, tuple[int, int]]) -> dict[str, float]:
    """``busy_share`` of every CPU since ``before``, keyed by the CPU number as text."""
    return {str(c): round(busy_share(before, c), 3) for c in before}


def status_kb(pid: int, key: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmHWM``, ``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0

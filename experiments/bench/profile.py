"""Profile the gateway's hot path under the bench's load (py-spy, raw folded stacks).

    python -m experiments.bench.profile --rate 2000 --seconds 8 [--shed]

Starts the nginx 1 KB backend (CPU 0) and the ballast CLI with all four stages
(fixed limit 1000, CPU 1), drives it open loop from this process (CPU 0), and
records the gateway with ``py-spy record --format raw`` at 500 Hz. Prints the
functions with the most own samples and their inclusive share, and the CPU us
per request of the same run. ``--shed`` sends ``X-Deadline-Ms: 0`` instead
(every request shed at admission), through the closed-loop raw client.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from experiments._harness.procs import processes
from experiments._harness.servers import start_gateway, start_nginx_backend
from experiments.bench.drive import blast, open_loop, request_bytes
from experiments.bench.run import CPU_LOAD, CPU_PROXY, FIXED_CONFIG
from experiments.hotpath.micro import print_profile


def main(argv: list[str] | None = None) -> int:
    """Run the profile and print its top."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.profile")
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--shed", action="store_true", help="profile the dead-on-arrival shed path")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    os.sched_setaffinity(0, {CPU_LOAD})
    py_spy = str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        up = start_nginx_backend(procs, CPU_LOAD)
        gw = start_gateway(procs, "gw", up.base, CPU_PROXY, FIXED_CONFIG)
        open_loop(gw, 500.0, 1.0, rep=-1)
        out = Path(tmp) / "profile.txt"
        cmd = [py_spy, "record", "-p", str(gw.pid), "-d", str(int(a.seconds)), "-f", "raw",
               "-o", str(out), "-r", "500", "--nonblocking"]  # fmt: skip
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if a.shed:
                req = request_bytes("/1k", {"X-Deadline-Ms": "0"})
                b = blast(gw, "shed", req, 32, a.seconds, rep=0)
                print(f"shed closed loop: {b.rps:,.0f} rps, {b.cpu_us:.1f} us/req")
            else:
                r = open_loop(gw, a.rate, a.seconds, rep=0)
                print(f"open loop {a.rate:.0f} rps: p99 {r.p99_ms:.1f} ms, {r.cpu_us:.0f} us/req")
        finally:
            spy.wait(60)
        print_profile(out, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())

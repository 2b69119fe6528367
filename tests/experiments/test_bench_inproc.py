"""``experiments.bench.inproc``: the gateway's own CPU per request, measured in process.

The bench must measure the request it claims to: every request gets nginx's 1 KB
answer back through the gateway's server protocol, on both paths (the lane and,
with ``server.lane: false``, the ASGI task), and the numbers are positive.
"""

from __future__ import annotations

from pathlib import Path

import uvloop

from experiments.bench import inproc


def test_both_paths_answer_every_request(tmp_path: Path) -> None:
    """A short run of each path completes (each request's 1 KB answer came back)."""
    off = tmp_path / "nolane.yaml"
    off.write_text("server:\n  lane: false\n")
    lane = uvloop.run(inproc._run(None, 50))
    asgi = uvloop.run(inproc._run(str(off), 50))
    assert lane > 0 and asgi > 0


def test_main_prints_one_row_per_gateway(tmp_path: Path, capsys: object) -> None:
    """The table has the defaults' row and one per ``--config``."""
    off = tmp_path / "nolane.yaml"
    off.write_text("server:\n  lane: false\n")
    inproc.main(["--requests", "20", "--reps", "1", "--config", str(off)])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| gateway", "| defaults", f"| {off}"]

"""``ballast check-config`` and the CLI's start-up messages (issue 13 item 9)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ballast_asgi.core.errors import ConfigError
from ballast_asgi.server.cli import bind, main

CASES = {
    "upstream: ftp://x\n": "upstream: must be an http:// or https:// URL",
    "upstream: 127.0.0.1:9101\n": "upstream: must be an http:// or https:// URL",
    "": "the file is empty",
    "# only a comment\n": "the file is empty",
    "upstream: http://a\nupstream: http://b\n": "line 2, column 1: duplicate key 'upstream'",
    "upstream: http://a\nproxy:\n  timeout_ms: 5\n  timeout_ms: 6\n": "line 4, column 3: dupl",
    "upstream: http://a\nproxy: {timeout_ms: [1\n": "line 3, column 1: not valid YAML",
    "upstream: http://a\nproxy:\n\ttimeout_ms: 1\n": "line 3, column 1: not valid YAML",
    "upstream: http://a\nbreaker:\n  failure_statuses: [200, 999]\n": "got [200, 999]",
    "upstream: http://a\nretry:\n  retry_statuses: [429]\n": "got [429]",
}


@pytest.mark.parametrize(("text", "message"), list(CASES.items()))
def test_check_config_rejects_with_one_clear_line(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad file exits 2 with one line naming the problem (and no doubled 'got')."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert err.count("got ") <= 1


def test_check_config_ignores_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A good file passes; BALLAST_UPSTREAM cannot mask the file's bad upstream."""
    monkeypatch.setenv("BALLAST_UPSTREAM", "http://fine.test")
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("upstream: http://127.0.0.1:9101\n")
    bad.write_text("upstream: ftp://x\n")
    assert main(["check-config", str(good)]) == 0
    assert main(["check-config", str(bad)]) == 2
    assert "ok: " in capsys.readouterr().out


def test_check_config_help(capsys: pytest.CaptureFixture[str]) -> None:
    """check-config --help prints its usage and exits 0."""
    with pytest.raises(SystemExit) as exc:
        main(["check-config", "--help"])
    assert exc.value.code == 0
    assert "usage: ballast check-config" in capsys.readouterr().out


def test_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A taken admin port: exit 2 with one line naming the address; no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["--upstream", "http://127.0.0.1:1", "--port", "0", "--admin-port", str(port)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == f"ballast: cannot listen on 127.0.0.1:{port} (admin port): address already in use"


def test_bind_reports_bad_host() -> None:
    """An unresolvable host is a ConfigError naming it."""
    with pytest.raises(ConfigError, match=r"nonexistent\.invalid"):
        bind("nonexistent.invalid", 0, "traffic port")

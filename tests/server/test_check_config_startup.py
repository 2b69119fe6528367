"""``check-config`` refuses what start-up would refuse, the same way (issue 30 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ballast_asgi.server.cli import main
from tests.e2e.support import NO_BALLAST_ENV, free_port, serve_in_thread, stop_thread
from tests.fakes import EchoHandler

ROOT = Path(__file__).resolve().parents[2]


def _pem(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A self-signed certificate, its key, and the two in one file (openssl)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    both = tmp_path / "both.pem"
    both.write_bytes(cert.read_bytes() + key.read_bytes())
    return cert, key, both


def _cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    cert, key, _ = _pem(tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    other = tmp_path / "other"
    other.mkdir()
    _, other_key, _ = _pem(other)
    up = "upstream: http://127.0.0.1:9101\n"
    return {
        "port_letters": ("upstream: http://127.0.0.1:abc\n", "upstream: the port must be"),
        "port_range": ("upstream: http://127.0.0.1:99999\n", "upstream: the port must be"),
        "port_in_list": ("upstream: [http://a:1, 'http://b:70000']\n", "upstream.1.url: the port"),
        "query": ("upstream: 'http://127.0.0.1:9101/?a=1'\n", "upstream: no query or fragment"),
        "fragment": ("upstream: 'http://127.0.0.1:9101/#top'\n", "upstream: no query or fragm"),
        "canary_port": (up + "canary: {upstream: 'http://c:0'}\n", "canary.upstream: the port"),
        "cert_without_key": (up + f"server: {{ssl_certfile: {cert}}}\n",
                             f"server.ssl_certfile: '{cert}' holds no private key"),
        "junk_cert": (up + f"server: {{ssl_certfile: {junk}, ssl_keyfile: {key}}}\n",
                      f"server.ssl_certfile: '{junk}' holds no PEM certificate"),
        "wrong_key": (up + f"server: {{ssl_certfile: {cert}, ssl_keyfile: {other_key}}}\n",
                      "server.ssl_keyfile: cannot load the key"),
        "typo": ("upstreem: http://127.0.0.1:9101\n", "upstreem: unknown key (did you mean "
                 "'upstream'?)"),
        "nested_typo": (up + "breaker: {open_msec: 10}\n", "breaker.open_msec: unknown key (did "
                        "you mean 'open_ms'?)"),
    }  # fmt: skip


def test_every_case_fails_check_config_and_start_up_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad file: check-config exits 2 with one line naming the key; so does start-up."""
    for name, (text, message) in _cases(tmp_path).items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        assert main(["check-config", str(path)]) == 2, name
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (name, err)
        assert main(["--config", str(path), "--port", "0", "--admin-port", "0"]) == 2, name
        started = capsys.readouterr().err.strip()
        assert message in started and len(started.splitlines()) == 1, (name, started)


def test_real_process_prints_no_traceback(tmp_path: Path) -> None:
    """As a user runs it: a certificate without its key is one line on stderr, exit 2."""
    cert, _, both = _pem(tmp_path)
    bad, good = tmp_path / "bad.yaml", tmp_path / "good.yaml"
    bad.write_text(f"upstream: http://127.0.0.1:9101\nserver: {{ssl_certfile: {cert}}}\n")
    good.write_text(f"upstream: http://127.0.0.1:9101\nserver: {{ssl_certfile: {both}}}\n")
    env = {**os.environ, **NO_BALLAST_ENV}
    run = [sys.executable, "-m", "ballast_asgi", "check-config"]
    out = subprocess.run([*run, str(bad)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "server.ssl_certfile" in out.stderr
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("ok:"), ok.stderr


def test_missing_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """check-config on a missing file names that file, not BALLAST_CONFIG."""
    missing = tmp_path / "missing.yaml"
    assert main(["check-config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: cannot read the config file" in err and "BALLAST_CONFIG" not in err


def test_version_and_help_list_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    """``--version`` prints it; ``--help`` lists check-config, register and controller."""
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("ballast 0.")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(f"ballast {c}" in text for c in ("check-config", "register", "controller"))


def test_bad_cli_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``--port 99999`` is refused by the parser (it raised OverflowError at bind)."""
    with pytest.raises(SystemExit) as done:
        main(["--upstream", "http://127.0.0.1:9101", "--port", "99999"])
    assert done.value.code == 2 and "--port: must be in 0..65535" in capsys.readouterr().err


def test_connect_tries_upstreams_and_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--connect: a live upstream is reachable, a dead one and a dead Redis are not (exit 2)."""
    live = free_port()
    server, thread = serve_in_thread(EchoHandler(), live)
    dead, dead_redis = free_port(), free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(
        f"upstream: [http://127.0.0.1:{live}, http://127.0.0.1:{dead}]\n"
        f"rate_limit: {{enabled: true, mode: redis, redis_url: 'redis://:pw@127.0.0.1:{dead_redis}/0'}}\n"
    )  # fmt: skip
    try:
        code = main(["check-config", str(path), "--connect", "--timeout", "5"])
    finally:
        stop_thread(server, thread)
    out, err = capsys.readouterr()
    assert code == 2
    assert f"reachable: upstream http://127.0.0.1:{live}" in out
    assert f"unreachable: upstream http://127.0.0.1:{dead}" in err
    assert f"unreachable: redis redis://***@127.0.0.1:{dead_redis}/0" in err and "pw" not in err
    path.write_text(f"upstream: http://127.0.0.1:{live}\n")
    server, thread = serve_in_thread(EchoHandler(), live)
    try:
        assert main(["check-config", str(path), "--connect"]) == 0
    finally:
        stop_thread(server, thread)

"""The compiled cores (ADR 0021) are used only while they are current; otherwise the sources."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ballast_asgi.core import native

ROOT = Path(__file__).resolve().parents[2]


def _fake_build(root: Path, **manifest: object) -> None:
    """A build's layout under ``root``: empty library files and a manifest."""
    for name in (*native.MODULES, native.LIBRARY):
        path = native.built(name, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    doc = {"tag": native.tag(), "modules": {m: native.digest(m) for m in native.MODULES}}
    doc.update(manifest)
    (root / "manifest.json").write_text(json.dumps(doc))


def test_a_current_build_is_usable(tmp_path: Path) -> None:
    _fake_build(tmp_path)
    assert native.stale(tmp_path) is None


def test_a_build_is_refused_when_anything_changed(tmp_path: Path) -> None:
    """No build, another interpreter, another module list, an edited source, a missing file."""
    assert native.stale(tmp_path) == "no build (make native)"
    _fake_build(tmp_path, tag="cpython-312.so")
    assert native.stale(tmp_path) == "built for another interpreter"
    _fake_build(
        tmp_path, modules={"ballast_asgi.core.head": native.digest("ballast_asgi.core.head")}
    )
    assert native.stale(tmp_path) == "built from another module list"
    edited = {m: native.digest(m) for m in native.MODULES}
    edited["ballast_asgi.proxy.headers"] = "0" * 64  # compiled from another text
    _fake_build(tmp_path, modules=edited)
    assert native.stale(tmp_path) == "ballast_asgi.proxy.headers changed since it was compiled"
    _fake_build(tmp_path)
    native.built(native.LIBRARY, tmp_path).unlink()
    assert native.stale(tmp_path) == "the group library is missing"
    (tmp_path / "manifest.json").write_text("{not json")
    assert native.stale(tmp_path) == "no build (make native)"


def test_the_finder_serves_only_the_compiled_modules(tmp_path: Path) -> None:
    _fake_build(tmp_path)
    finder = native._Finder(tmp_path)
    spec = finder.find_spec("ballast_asgi.core.head")
    assert spec is not None and spec.origin == str(native.built("ballast_asgi.core.head", tmp_path))
    assert finder.find_spec(native.LIBRARY) is not None
    assert finder.find_spec("ballast_asgi.core.limiter") is None  # interpreted on purpose
    assert finder.find_spec("json") is None


def test_every_compiled_module_exists_and_is_a_core_the_headers_or_the_request_path() -> None:
    for name in native.MODULES:
        assert native.source(name).is_file(), name
        assert (
            name.startswith("ballast_asgi.core.")
            or name == "ballast_asgi.proxy.headers"
            or name in native.REQUEST_PATH
        ), name
    path = ("ballast_asgi.middleware.", "ballast_asgi.proxy.", "ballast_asgi.gateway.lane",
            "ballast_asgi.gateway.hooks", "ballast_asgi.server.cycle",
            "ballast_asgi.telemetry.loop_lag", "ballast_asgi.telemetry.hot_values",
            "ballast_asgi.core.")  # fmt: skip
    assert native.REQUEST_PATH.issubset(native.MODULES)
    assert all(name.startswith(path) for name in native.REQUEST_PATH)


def _imported_from(env: dict[str, str]) -> str:
    code = "import ballast_asgi.core.head as h, ballast_asgi.core.native as n; print(h.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env)  # fmt: skip
    return out.stdout.strip()


def test_turned_off_the_sources_are_imported() -> None:
    """``BALLAST_NATIVE=0``: a fresh interpreter imports the source, built or not."""
    env = {**os.environ, native.ENV: "0"}
    assert _imported_from(env).endswith("core/head.py")


def test_a_fresh_interpreter_imports_the_build_exactly_when_it_is_current() -> None:
    """A current build (``make native`` ran here) is what is imported; with none, or a
    stale one (no C compiler, an edited source), the source is."""
    env = {k: v for k, v in os.environ.items() if k != native.ENV}
    origin = _imported_from(env)
    if native.stale() is None:
        assert origin.startswith(str(native.DIR))
    else:
        assert origin.endswith("core/head.py")


def test_a_damaged_build_is_not_used(tmp_path: Path) -> None:
    """A build whose manifest holds but whose library does not load (truncated, another
    ABI): a fresh interpreter falls back to the sources instead of failing to import."""
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(native.PACKAGE, copy / "ballast_asgi", ignore=shutil.ignore_patterns(".native"))
    _fake_build(copy / "ballast_asgi" / ".native")  # digests match, every library empty
    code = (
        "import ballast_asgi.core.head as h, ballast_asgi.core.native as n; "
        "print(h.__file__, n.active(), n.stale(), n.status()['why_not'][:23])"
    )
    env = {k: v for k, v in os.environ.items() if k != native.ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=copy, env=env)  # fmt: skip
    origin, active, stale, why = out.stdout.split(maxsplit=3)
    assert origin == str(copy / "ballast_asgi" / "core" / "head.py")
    assert active == "False" and stale == "None"  # current by its manifest, yet unused
    assert why.strip() == "the build does not load"


def test_no_compiled_coroutine_awaits_while_handling_an_exception() -> None:
    """mypyc keeps the exception being handled in the thread, not in the coroutine
    (mypyc#1114): a compiled coroutine suspended inside ``except`` or ``finally`` leaves
    it to whatever runs next, which re-raised a finished request's error in the next
    request on the same loop (the aiohttp half of the response framing differential
    failed with the proxy app compiled). No compiled module may await there."""
    found = []
    for name in native.MODULES:
        path = native.source(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Try | ast.TryStar):
                continue
            for body in (node.finalbody, *(h.body for h in node.handlers)):
                for sub in (s for stmt in body for s in ast.walk(stmt)):
                    if isinstance(sub, ast.Await | ast.AsyncFor | ast.AsyncWith):
                        found.append(f"{name}:{sub.lineno}")
    assert not found


def test_a_build_holds_the_lock_and_a_waiting_one_finds_it_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builds of one checkout take turns: the lock is held while a build runs and is
    put in place, and a build that waited for it checks again before compiling."""
    from ballast_tools import native as tool

    monkeypatch.delenv(native.ENV, raising=False)  # ``make pytest``'s second pass sets it
    monkeypatch.setattr(tool, "LOCK", tmp_path / "lock")
    monkeypatch.setattr(native, "DIR", tmp_path / "native")
    held: list[bool] = []

    def fake_build() -> Path:
        with (tmp_path / "lock").open("a") as other:  # another open file: another build
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
        out = tmp_path / "work" / "out"
        out.mkdir(parents=True)
        return out

    monkeypatch.setattr(tool, "build", fake_build)
    assert tool.main([]) == 0
    assert held == [True] and (tmp_path / "native").is_dir()

    answers = iter(["not built", None])  # stale before the lock; current once it is taken
    monkeypatch.setattr(native, "stale", lambda *_: next(answers))

    def no_build() -> Path:
        raise AssertionError("compiled again after the build it waited for")

    monkeypatch.setattr(tool, "build", no_build)
    assert tool.main(["--if-stale"]) == 0

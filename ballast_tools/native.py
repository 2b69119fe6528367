"""Compile the hot pure modules with mypyc (ADR 0021): ``python -m ballast_tools.native``.

Builds ``ballast_asgi.core.native.MODULES`` into a fresh directory, then puts
it in place of ``ballast_asgi/.native/`` with a manifest of the sources'
digests (``core/native.py`` loads the builds only while those digests hold).
Needs mypy (a dev dependency: mypyc ships with it), setuptools and a C
compiler; without them it says so and exits 1, and the package keeps importing
its sources. ``--if-stale`` builds only when the build is missing or not current
(``make native``); ``--clean`` removes the builds; ``BALLAST_NATIVE=0`` skips.
Two builds of one checkout at once (``make`` in two shells) take turns on
``ballast_asgi/.native.lock``: the second waits, then finds the build current.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ballast_asgi.core import native

#: Held while a build runs and is put in place (``flock``: released if the process dies).
LOCK = native.PACKAGE / ".native.lock"


@contextmanager
def one_build_at_a_time() -> Iterator[None]:
    """Wait for any other build of this checkout, then hold the lock until the block ends."""
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build() -> Path:
    """Compile every module of ``native.MODULES``; return the directory holding them."""
    from mypyc.build import mypycify
    from setuptools import Distribution  # type: ignore[import-untyped]

    repo = native.PACKAGE.parent
    work = Path(tempfile.mkdtemp(prefix="ballast-native-"))
    out = work / "out"
    here = Path.cwd()
    os.chdir(repo)  # mypy reads the project's settings (pyproject.toml) and names modules
    try:
        digests = {name: native.digest(name) for name in native.MODULES}
        paths = [str(native.source(name).relative_to(repo)) for name in native.MODULES]
        extensions = mypycify(paths, opt_level="3", group_name=native.GROUP,
                              target_dir=str(work / "c"))  # fmt: skip
        dist = Distribution({"name": "ballast-asgi-native", "ext_modules": extensions})
        command = dist.get_command_obj("build_ext")
        command.build_lib = str(out)
        command.build_temp = str(work / "tmp")
        dist.run_command("build_ext")
    finally:
        os.chdir(here)
    manifest = {"tag": native.tag(), "modules": digests, "built": time.time()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    reason = native.stale(out)
    if reason is not None:
        raise RuntimeError(f"the build is not usable: {reason}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ballast_tools.native", description=__doc__)
    p.add_argument("--clean", action="store_true", help="remove the builds")
    p.add_argument(
        "--if-stale", action="store_true", help="build only when the build is not current"
    )
    args = p.parse_args(argv)
    if args.clean:
        shutil.rmtree(native.DIR, ignore_errors=True)
        print(f"removed {native.DIR}")
        return 0
    if os.environ.get(native.ENV) == "0":
        print(f"ballast native: {native.ENV}=0, not compiled (the sources are used)")
        return 0
    if args.if_stale and native.stale() is None:
        return 0  # current: nothing to do
    started = time.monotonic()
    with one_build_at_a_time():
        if args.if_stale and native.stale() is None:
            return 0  # built by the build this one waited for
        try:
            out = build()
        except Exception as exc:  # no compiler, no headers, no mypy: the sources stay in use
            print(f"ballast native: not compiled ({type(exc).__name__}: {exc}); the sources "
                  "are used, which is the same code, slower", file=sys.stderr)  # fmt: skip
            return 1
        shutil.rmtree(native.DIR, ignore_errors=True)
        shutil.move(str(out), native.DIR)
        shutil.rmtree(out.parent, ignore_errors=True)
    print(f"ballast native: {len(native.MODULES)} modules compiled into {native.DIR} "
          f"in {time.monotonic() - started:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

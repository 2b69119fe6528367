"""Headless Chromium driven over the DevTools protocol (websockets only; no Selenium).

``Browser`` starts the system ``chromium`` on a free debugging port, opens one
page, records console errors, uncaught exceptions and every URL the page
requests, evaluates expressions and takes screenshots.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1400, 980)) -> None:
        assert CHROMIUM, "chromium is not installed (make system-deps installs it)"
        args = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-port=0", "--remote-allow-origins=*",
                f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                "--no-first-run", "--disable-extensions", "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.ws: ClientConnection
        self.errors: list[str] = []
        self.requested: list[str] = []
        self._ids = itertools.count(1)
        self._stack = contextlib.ExitStack()
        try:
            self.ws = self._stack.enter_context(self._page(self._devtools_port()))
            for domain in ("Runtime", "Log", "Network", "Page"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _devtools_port(self) -> int:
        assert self.proc.stderr is not None
        limit = time.monotonic() + 30
        while time.monotonic() < limit:  # bounded: read chromium's start-up lines
            line = self.proc.stderr.readline().decode()
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found.group(1))
            assert line or self.proc.poll() is None, "chromium exited"
        raise AssertionError("chromium did not start")

    def _page(self, port: int) -> Any:
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list").json()
        page = next(t for t in targets if t["type"] == "page")
        return connect(page["webSocketDebuggerUrl"], max_size=2**26)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command; record events that arrive meanwhile; return its result."""
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == ident:
                assert "error" not in message, message
                return dict(message.get("result", {}))
            self._event(message)

    def pump(self, seconds: float) -> None:
        """Record events for ``seconds`` (the page runs meanwhile)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                self._event(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params["exceptionDetails"])[:500])
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            self.errors.append(json.dumps(params["args"])[:500])
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])
        elif method == "Network.requestWillBeSent":
            self.requested.append(params["request"]["url"])

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        """Save a PNG of the viewport."""
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the page connection and stop chromium (by PID)."""
        self._stack.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

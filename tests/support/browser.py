"""A real headless Chromium (Debian's `chromium`) driven over the DevTools protocol.

No WebDriver and no browser download: `chromium --headless --remote-debugging-port=0`
writes its port to DevToolsActivePort in its profile directory, and one page target is
driven over a websocket (`websockets`' sync client, which uvicorn[standard] brings).
`dump_dom` is the plain command-line use: `chromium --headless --dump-dom`.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

START_TIMEOUT_S = 30.0
FLAGS = [
    "--headless",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
]


def find_chromium() -> str | None:
    """Debian's chromium (or $CHROMIUM), or None where there is none."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    return None


def _flags() -> list[str]:
    # as root Chromium refuses its sandbox, and containers often lack the user namespaces it
    # needs: the pages are our own, on 127.0.0.1
    return [*FLAGS, "--no-sandbox"]


def dump_dom(url: str, budget_ms: int = 5000, size: str = "1280,900") -> str:
    """The DOM after the page's scripts ran for `budget_ms` of virtual time."""
    exe = find_chromium()
    assert exe is not None
    with tempfile.TemporaryDirectory(prefix="znni-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [exe, *_flags(), f"--user-data-dir={profile}", f"--window-size={size}",
             f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            _end_group(proc)
    assert proc.returncode == 0, err[-2000:]
    return out


def _end_group(proc: subprocess.Popen) -> None:
    """Stop a Chromium started in a session of its own, and wait for its helper processes
    too (they still write into the profile for a moment after the browser exits)."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the whole group is gone
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
    proc.wait()


class Browser:
    """One headless Chromium with one page; `with Browser() as b: b.goto(url) ...`."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.width, self.height = width, height
        self._ids = itertools.count(1)
        self.console: list[str] = []  # console messages and exceptions of the page

    def __enter__(self) -> Browser:
        exe = find_chromium()
        assert exe is not None, "no chromium"
        self._profile = tempfile.TemporaryDirectory(prefix="znni-chromium-",
                                                    ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [exe, *_flags(), f"--user-data-dir={self._profile.name}",
             f"--window-size={self.width},{self.height}", "--remote-debugging-port=0",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            self._stack = contextlib.ExitStack()
            self._ws = self._stack.enter_context(
                connect(self._page_socket(), max_size=None, open_timeout=10))
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Log.enable")  # CSP violations and failed loads are reported here
            self.call("Emulation.setDeviceMetricsOverride", width=self.width,
                      height=self.height, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._stop()

    def _stop(self) -> None:
        _end_group(self.proc)
        self._profile.cleanup()

    def _page_socket(self) -> str:
        """The websocket of the about:blank page, once Chromium has written its port."""
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            if port_file.exists() and (lines := port_file.read_text().split()):
                targets = httpx.get(f"http://127.0.0.1:{lines[0]}/json/list").json()
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise RuntimeError(f"chromium did not open its DevTools port in {START_TIMEOUT_S} s")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; events that arrive meanwhile are kept (console) or dropped."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv(timeout=60))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        if msg.get("method") == "Runtime.consoleAPICalled":
            args = msg["params"].get("args", [])
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in args)
            self.console.append(f"{msg['params'].get('type')}: {text}")
        elif msg.get("method") == "Log.entryAdded":
            entry = msg["params"]["entry"]
            self.console.append(f"log {entry.get('level')}: {entry.get('text')}")
        elif msg.get("method") == "Runtime.exceptionThrown":
            details = msg["params"]["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.console.append(f"exception: {text}")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Poll until the expression is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            try:
                value = self.js(expression)
            except RuntimeError:
                value = None  # e.g. during a navigation
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"not true in {timeout_s} s: {expression} (console: {self.console})")

    def text(self) -> str:
        return self.js("document.body.innerText")

    def html(self) -> str:
        return self.js("document.documentElement.outerHTML")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (not only the window) at `path`."""
        height = int(self.js("document.documentElement.scrollHeight"))
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": self.width,
                               "height": max(height, 200), "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

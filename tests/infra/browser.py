"""Headless Chromium (Debian package ``chromium``) driven over the Chrome DevTools Protocol.

One browser process per :class:`HeadlessChromium`; each :meth:`HeadlessChromium.open` makes a new tab,
navigates, waits for the load event (and optionally a JS condition) and returns a :class:`Page` that
records console errors, uncaught exceptions and failed loads, evaluates JavaScript and takes
screenshots. CDP messages go over a websocket (``websocket-client``), so nothing is downloaded and no
chromedriver is needed.

Usage::

    from tests.infra.browser import HeadlessChromium, serve_directory
    with HeadlessChromium() as browser, serve_directory(Path("out/report")) as base:
        page = browser.open(f"{base}/index.html", wait_for="window.plotReady === true")
        assert page.errors() == []
        n = page.evaluate("document.getElementById('plot').data[0].x.length")
        page.screenshot(Path("out/page.png"))
"""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import requests
import websocket

from tests.infra._proc import start_process, stop_process, tail, wait_until


def chromium_binary() -> str:
    """Path of the chromium executable (``DYNOPLAN_CHROMIUM`` overrides ``PATH`` lookup).

    Raises:
        FileNotFoundError: not installed; ``make test`` installs Debian's ``chromium`` package.
    """
    path = os.environ.get("DYNOPLAN_CHROMIUM")
    if not path:
        for name in ("chromium", "chromium-browser", "google-chrome"):
            path = shutil.which(name)
            if path:
                break
    if not path:
        raise FileNotFoundError(
            "chromium not found on PATH; install it with `apt-get install -y chromium`"
            " (tools/install-system-deps.sh, run by `make test`)"
        )
    return path


class JavaScriptError(RuntimeError):
    """A JS expression passed to :meth:`Page.evaluate` threw; the message is the JS exception text."""


@dataclass
class ConsoleMessage:
    """One console/log/exception entry: ``level`` is 'error', 'warning', 'log', 'exception'..."""

    level: str
    text: str
    source: str = "console"
    url: str = ""


@dataclass
class Page:
    """One tab, with everything it logged since it was opened (see :meth:`errors`)."""

    ws: websocket.WebSocket
    target_id: str
    browser: HeadlessChromium
    messages: list[ConsoleMessage] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _events: list[dict] = field(default_factory=list)

    # ---------------------------------------------------------------- protocol
    def send(self, method: str, params: dict | None = None, timeout_s: float = 30.0) -> dict:
        """Send one CDP command and return its ``result``; events seen meanwhile are recorded.

        Raises:
            RuntimeError: the browser answered with a protocol error.
            TimeoutError: no answer within ``timeout_s``.
        """
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._recv(deadline, f"answer to {method}")
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method} failed: {msg['error']}")
                return msg.get("result", {})

    def _recv(self, deadline: float, what: str) -> dict:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"headless chromium: no {what} in time")
        self.ws.settimeout(remaining)
        try:
            msg = json.loads(self.ws.recv())
        except websocket.WebSocketTimeoutException as exc:
            raise TimeoutError(f"headless chromium: no {what} in time") from exc
        if "method" in msg:
            self._on_event(msg)
        return msg

    def _on_event(self, msg: dict) -> None:
        method, p = msg["method"], msg.get("params", {})
        self._events.append(msg)
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", a.get("type")))) for a in p.get("args", []))
            self.messages.append(ConsoleMessage(p.get("type", "log"), text, "console"))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            text = d.get("exception", {}).get("description") or d.get("text", "exception")
            self.messages.append(ConsoleMessage("exception", text, "exception", d.get("url", "")))
        elif method == "Log.entryAdded":
            e = p.get("entry", {})
            self.messages.append(
                ConsoleMessage(e.get("level", "info"), e.get("text", ""), e.get("source", "log"), e.get("url", ""))
            )

    def wait_event(self, method: str, timeout_s: float = 30.0) -> dict:
        """Wait for the next CDP event named ``method`` (already-recorded ones don't count)."""
        start = len(self._events)
        deadline = time.monotonic() + timeout_s
        while True:
            for ev in self._events[start:]:
                if ev["method"] == method:
                    return ev
            start = len(self._events)
            self._recv(deadline, f"event {method}")

    def pump(self, duration_s: float) -> None:
        """Keep reading events for ``duration_s`` seconds (e.g. to catch late console errors)."""
        deadline = time.monotonic() + duration_s
        try:
            while True:
                self._recv(deadline, "event")
        except TimeoutError:
            pass

    # ---------------------------------------------------------------- page API
    def evaluate(self, expression: str, await_promise: bool = True, timeout_s: float = 30.0) -> Any:
        """Evaluate a JS expression in the page and return its JSON value.

        Raises:
            JavaScriptError: the expression threw (message: the JS exception description).
        """
        res = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": await_promise},
            timeout_s,
        )
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise JavaScriptError(d.get("exception", {}).get("description") or d.get("text", "JS error"))
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0, interval_s: float = 0.1) -> Any:
        """Poll a JS expression until it is truthy; return its value.

        Raises:
            TimeoutError: still falsy after ``timeout_s`` (message includes the errors recorded so far).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            self.pump(interval_s)
        raise TimeoutError(f"JS condition {expression!r} still false after {timeout_s} s; page errors: {self.errors()}")

    def errors(self, ignore_urls: tuple[str, ...] = ("/favicon.ico",)) -> list[str]:
        """Console errors, uncaught exceptions and failed-load log entries, as text (in order).

        Entries whose URL ends with one of ``ignore_urls`` are left out (by default the favicon the
        browser requests on its own).
        """
        return [
            f"{m.source}: {m.text}" + (f" ({m.url})" if m.url else "")
            for m in self.messages
            if m.level in ("error", "exception", "assert") and not (m.url and m.url.endswith(ignore_urls))
        ]

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the viewport to ``path`` (parent directories created)."""
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.browser._close_target(self.target_id)


class HeadlessChromium:
    """A headless chromium process with a DevTools port on 127.0.0.1 and a private profile dir."""

    def __init__(self, window_size: tuple[int, int] = (1280, 900), timeout_s: float = 60.0) -> None:
        self.binary = chromium_binary()
        self.profile_dir = Path(tempfile.mkdtemp(prefix="dynoplan-chromium-"))
        self.log_path = self.profile_dir / "chromium.log"
        self.proc: subprocess.Popen | None = start_process(
            [
                self.binary,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--mute-audio",
                f"--window-size={window_size[0]},{window_size[1]}",
                f"--user-data-dir={self.profile_dir / 'profile'}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                "about:blank",
            ],
            self.log_path,
        )
        port_file = self.profile_dir / "profile" / "DevToolsActivePort"
        try:
            wait_until(
                lambda: port_file.exists() and port_file.read_text().strip() != "",
                timeout_s,
                "chromium DevTools port",
                self.proc,
                self.log_path,
            )
            self.port = int(port_file.read_text().splitlines()[0])
            self.http = f"http://127.0.0.1:{self.port}"
            wait_until(
                lambda: requests.get(f"{self.http}/json/version", timeout=2).ok,
                timeout_s,
                "chromium DevTools HTTP",
                self.proc,
                self.log_path,
            )
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def version(self) -> dict:
        """``/json/version`` (Browser, Protocol-Version, User-Agent...)."""
        return requests.get(f"{self.http}/json/version", timeout=5).json()

    def open(self, url: str, wait_for: str | None = None, timeout_s: float = 60.0, settle_s: float = 0.2) -> Page:
        """Open ``url`` in a new tab, wait for its load event, then for ``wait_for`` (a JS expression)
        to be truthy, then read events for ``settle_s`` more seconds; return the :class:`Page`.

        Raises:
            RuntimeError: navigation failed (e.g. connection refused), with the error text.
            TimeoutError: no load event or ``wait_for`` still false within ``timeout_s``.
        """
        r = requests.put(f"{self.http}/json/new?about:blank", timeout=10)
        r.raise_for_status()
        target = r.json()
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=timeout_s, suppress_origin=True)
        page = Page(ws=ws, target_id=target["id"], browser=self)
        try:
            for domain in ("Runtime", "Log", "Page"):
                page.send(f"{domain}.enable")
            nav = page.send("Page.navigate", {"url": url}, timeout_s)
            if nav.get("errorText"):
                raise RuntimeError(f"navigation to {url} failed: {nav['errorText']}")
            page.wait_event("Page.loadEventFired", timeout_s)
            if wait_for:
                page.wait_for(wait_for, timeout_s)
            page.pump(settle_s)
        except BaseException:
            page.close()
            raise
        return page

    def _close_target(self, target_id: str) -> None:
        try:
            requests.get(f"{self.http}/json/close/{target_id}", timeout=5)
        except requests.RequestException:
            pass

    def close(self) -> None:
        """Stop chromium (process group) and remove its profile dir. Idempotent."""
        stop_process(self.proc)
        self.proc = None
        shutil.rmtree(self.profile_dir, ignore_errors=True)

    def log_tail(self) -> str:
        return tail(self.log_path)


@contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """Serve the files under ``root`` over HTTP on a free 127.0.0.1 port (a thread, quiet logs);
    yields the base URL ``http://127.0.0.1:<port>``; the server is shut down on exit."""

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="serve_directory")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

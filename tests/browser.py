"""A headless Chromium (Debian's ``chromium`` package) driven over the Chrome DevTools Protocol with
``websockets``: navigate, run JavaScript, record the requests the page makes, take a screenshot.
No browser is downloaded: where ``chromium`` or ``websockets`` is missing, the test skips, saying so.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from types import TracebackType
from typing import Any

import httpx
import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]
LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


def chromium_or_skip() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium on PATH (Debian's chromium package; scripts/test installs it with apt)")
    pytest.importorskip("websockets", reason="the websockets package drives the browser (the test extra)")
    return path


class Browser:
    """One headless Chromium with one page, driven over CDP."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.requests: list[str] = []
        self._ids = itertools.count(1)
        # Chromium's own children (zygote, renderers) may still be writing the profile when it goes:
        # a left-over file there must not fail the test
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True)
        self.process = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its children in a process group of its own, ended with it
        )
        assert self.process.stderr is not None
        for line in self.process.stderr:  # the line that says where CDP listens
            match = LISTENING.search(line)
            if match:
                break
        else:
            raise RuntimeError(f"chromium exited ({self.process.wait()}) before listening")
        self.port = match.group(1).decode().split(":")[2].split("/")[0]

    async def __aenter__(self) -> Browser:
        import websockets

        port = self.port
        async with httpx.AsyncClient() as client:
            targets = (await client.get(f"http://127.0.0.1:{port}/json/list")).json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await websockets.connect(page["webSocketDebuggerUrl"], max_size=None)
        for method in ("Page.enable", "Runtime.enable", "Network.enable"):
            await self.call(method)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.ws.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # our own Chromium and its children, by its group
        self.process.wait()
        assert self.process.stderr is not None
        self.process.stderr.close()
        self._profile.cleanup()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command; return its result, recording the events that arrive meanwhile."""
        ident = next(self._ids)
        await self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(await self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result
            self._event(message)

    async def wait_for_event(self, method: str) -> dict[str, Any]:
        while True:
            message = json.loads(await self.ws.recv())
            self._event(message)
            if message.get("method") == method:
                params: dict[str, Any] = message["params"]
                return params

    def _event(self, message: dict[str, Any]) -> None:
        if message.get("method") == "Network.requestWillBeSent":
            self.requests.append(message["params"]["request"]["url"])

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for_event("Page.loadEventFired")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if it is a promise)."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        """The whole page, as a PNG."""
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return base64.b64decode(shot["data"])

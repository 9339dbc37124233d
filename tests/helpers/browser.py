"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): no websocket
library, no driver. Enough to open a page, click what a user clicks, type what a user types, read the DOM, catch
console errors and uncaught exceptions, and take a screenshot."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Browser:
    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        to_chrome, self._out = os.pipe()  # Chromium reads commands on fd 3 ...
        self._in, from_chrome = os.pipe()  # ... and writes replies and events on fd 4

        def wire() -> None:  # in the child: the pipe ends onto fds 3 and 4, inheritable across exec
            read, write = os.dup(to_chrome), os.dup(from_chrome)  # free fds above both (either may be 3 or 4)
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--remote-debugging-pipe",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            preexec_fn=wire,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self.timeout, self._next_id, self._buffer = timeout, 0, b""
        self.events: list[dict] = []
        self.session: str | None = None

    # -- protocol --------------------------------------------------------------------------------------------

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, browser: bool = False) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if not browser:
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    # -- what a user does ------------------------------------------------------------------------------------

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, browser=True)[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && !!document.body && !!document.body.dataset.tab")

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.js(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise TimeoutError(expression)
            time.sleep(0.05)

    def click(self, selector: str, text: str | None = None) -> None:
        """A real mouse click at the centre of the first element matching ``selector`` (and ``text``)."""
        find = (
            f"[...document.querySelectorAll({json.dumps(selector)})]"
            f".find(e => {json.dumps(text)} === null || e.textContent.trim() === {json.dumps(text)})"
        )
        self.js(f"{find}.scrollIntoView({{block: 'center'}})")
        box = self.js(
            f"(() => {{ const r = {find}.getBoundingClientRect(); "
            "return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1}
            )

    def type(self, selector: str, text: str) -> None:
        self.click(selector)
        self.call("Input.insertText", {"text": text})

    def select(self, selector: str, option: str, index: int = 0) -> None:
        """Choose ``option`` in the ``index``-th ``<select>`` matching ``selector`` (as a user's choice fires it)."""
        self.js(
            f"(() => {{ const s = document.querySelectorAll({json.dumps(selector)})[{index}]; "
            f"s.value = {json.dumps(option)}; s.dispatchEvent(new Event('change')); }})()"
        )

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(str(params.get("exceptionDetails")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(str(params["entry"]))
        return found

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", browser=True)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._out)
        os.close(self._in)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (no websocket, no
dependency): start headless Chromium, open a page, collect console errors, evaluate JavaScript,
take a screenshot.

The pipe protocol: Chromium reads JSON commands from fd 3 and writes JSON replies and events to
fd 4, each message terminated by a NUL byte.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--remote-debugging-pipe", "--hide-scrollbars",
         "--mute-audio", "--disable-dev-shm-usage")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """``with Browser(path) as b: b.open(url); b.evaluate(js); b.screenshot(path)``."""

    def __init__(self, executable: str, *, width: int = 1280, height: int = 900, timeout: float = 30.0):
        self.executable, self.width, self.height, self.timeout = executable, width, height, timeout
        self.events: list[dict] = []
        self._id = 0
        self._buf = b""

    def __enter__(self) -> Browser:
        self.profile = tempfile.mkdtemp(prefix="gdncheck-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        hi_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
        hi_w = fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)

        def child_fds():  # the child's fd 3 reads commands, fd 4 writes replies
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self._log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty browser must never block on it
        self.proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={self.width},{self.height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
            pass_fds=(3, 4), preexec_fn=child_fds)
        for fd in (cmd_r, res_w, hi_r, hi_w):
            os.close(fd)
        try:
            targets = self.send("Target.getTargets")["targetInfos"]
            page = next((t for t in targets if t["type"] == "page"), None)
            target = page["targetId"] if page else self.send("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                self.send(f"{domain}.enable", session=True)
            self.send("Emulation.setDeviceMetricsOverride", session=True, width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self._write({"id": 10 ** 6, "method": "Browser.close"})
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for fd in (self._cmd_w, self._res_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._log.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def log_tail(self, n: int = 2000) -> str:
        """The end of the browser's own log (stderr), for error messages."""
        self._log.flush()
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - n))
        return self._log.read().decode(errors="replace")

    # -- protocol ------------------------------------------------------------------------------
    def _write(self, msg: dict) -> None:
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError(f"timed out waiting for Chromium; its log ends:\n{self.log_tail()}")
            ready, _, _ = select.select([self._res_r], [], [], left)
            if ready:
                chunk = os.read(self._res_r, 1 << 16)
                if not chunk:
                    raise CDPError(f"Chromium closed the pipe (exit {self.proc.poll()}); its log ends:\n"
                                   f"{self.log_tail()}")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, *, session: bool = False, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self._write(msg)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + self.timeout
        while True:
            ev = self._read(deadline)
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    # -- what the tests use --------------------------------------------------------------------
    def open(self, url: str, *, javascript: bool = True) -> None:
        self.send("Emulation.setScriptExecutionDisabled", session=True, value=not javascript)
        self.events.clear()
        self.send("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str, *, await_promise: bool = False):
        res = self.send("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                        awaitPromise=await_promise)
        if "exceptionDetails" in res:
            raise CDPError(f"{expression!r} raised: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def load_images(self) -> list[dict]:
        """Load every image now (lazy ones too); each image's src, natural width and whether it decoded."""
        js = ("Promise.all(Array.from(document.images).map(i => { i.loading = 'eager'; "
              "return i.decode().then(() => ({src: i.getAttribute('src'), width: i.naturalWidth, ok: true}), "
              "() => ({src: i.getAttribute('src'), width: i.naturalWidth, ok: false})); }))")
        return self.evaluate(js, await_promise=True)

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads logged since the last :meth:`open`."""
        self.send("Runtime.evaluate", session=True, expression="0")  # flush pending events
        out = []
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}")
        return out

    def screenshot(self, path: str | Path, *, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            h = self.evaluate("document.documentElement.scrollHeight")
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": min(int(h), 8000), "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", session=True, **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

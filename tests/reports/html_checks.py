"""Reading a report page back: a strict parse of report.html (``parse_page``), and its rendering in
headless Chromium with every console error collected (``render_in_chromium``; the system's
``chromium``, driven over its DevTools pipe: no Python package needed).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
URL_ATTRIBUTES = {"src", "href", "srcset", "action", "poster", "data", "formaction", "background"}
PNG = b"\x89PNG\r\n\x1a\n"


@dataclasses.dataclass
class Table:
    css: str
    rows: list = dataclasses.field(default_factory=list)     # [[(tag, text, attrs)]]


@dataclasses.dataclass
class Page:
    errors: list = dataclasses.field(default_factory=list)   # tags left open, closed out of order
    titles: list = dataclasses.field(default_factory=list)
    metas: list = dataclasses.field(default_factory=list)
    urls: list = dataclasses.field(default_factory=list)     # (tag, attribute, value)
    tags: dict = dataclasses.field(default_factory=dict)     # tag -> count
    tables: list = dataclasses.field(default_factory=list)
    runs: dict = dataclasses.field(default_factory=dict)     # div.run id -> its tables
    text: str = ""


class _Parser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.page, self.stack = Page(), []
        self.table = self.cell = self.run = None
        self.run_depth = 0
        self.in_title = False
        self.texts: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.page.tags[tag] = self.page.tags.get(tag, 0) + 1
        if tag not in VOID:
            self.stack.append(tag)
        for name, value in attrs.items():
            if name in URL_ATTRIBUTES:
                self.page.urls.append((tag, name, value or ""))
        if "style" in attrs and "url(" in (attrs["style"] or ""):
            self.page.urls.append((tag, "style", attrs["style"]))
        if tag == "meta":
            self.page.metas.append(attrs)
        elif tag == "title":
            self.in_title = True
            self.page.titles.append("")
        elif tag == "div" and "run" in (attrs.get("class") or "").split():
            self.run, self.run_depth = attrs.get("id"), len(self.stack)
            self.page.runs[self.run] = []
        elif tag == "table":
            self.table = Table(attrs.get("class") or "")
            self.page.tables.append(self.table)
            if self.run is not None:
                self.page.runs[self.run].append(self.table)
        elif tag == "tr" and self.table is not None:
            self.table.rows.append([])
        elif tag in ("td", "th") and self.table is not None:
            self.cell = [tag, "", attrs]
            self.table.rows[-1].append(self.cell)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.page.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            if tag in self.stack:
                while self.stack.pop() != tag:
                    pass
            return
        if tag == "div" and self.run is not None and len(self.stack) == self.run_depth:
            self.run = None
        self.stack.pop()
        if tag == "title":
            self.in_title = False
        elif tag == "table":
            self.table = None
        elif tag in ("td", "th") and self.cell is not None:
            self.cell[1] = self.cell[1].strip()
            self.cell = None

    def handle_data(self, data):
        self.texts.append(data)
        if self.in_title:
            self.page.titles[-1] += data
        if self.cell is not None:
            self.cell[1] += data


def parse_page(text: str) -> Page:
    parser = _Parser()
    parser.feed(text)
    parser.close()
    page = parser.page
    page.errors += [f"<{tag}> never closed" for tag in parser.stack]
    page.text = " ".join("".join(parser.texts).split())
    return page


def embedded_pngs(page: Page) -> list[bytes]:
    """Every image of the page, decoded: each must be a PNG embedded as a data URI."""
    images = []
    for tag, name, value in page.urls:
        assert tag == "img" and name == "src" and value.startswith("data:image/png;base64,"), (tag, name, value[:80])
        data = base64.b64decode(value.split(",", 1)[1], validate=True)
        assert data.startswith(PNG)
        images.append(data)
    return images


def cell_texts(table: Table) -> list[list[str]]:
    return [[text for _, text, _ in row] for row in table.rows]


# ---------------------------------------------------------------------------------- Chromium
def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _DevTools:
    """Chromium's DevTools protocol over ``--remote-debugging-pipe``: it reads commands on its fd 3
    and writes replies and events on its fd 4, each a JSON text ended by a NUL byte."""

    def __init__(self, binary: str, profile: str, width: int):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # above every descriptor the child keeps, so that moving them to 3 and 4 overwrites neither
        high = [os.dup2(fd, 100 + i) for i, fd in enumerate((to_chrome_r, from_chrome_w))]
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def at_3_and_4():
            os.dup2(100, 3)
            os.dup2(101, 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
             "--remote-debugging-pipe", f"--window-size={width},1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=at_3_and_4, pass_fds=(3, 4))
        for fd in high:
            os.close(fd)
        self.buffer, self.next_id, self.events = b"", 0, []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_chrome], [], [], left)[0]:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read(deadline))

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self.to_chrome)
        os.close(self.from_chrome)


def console_errors(events: list[dict]) -> list[str]:
    """What the console showed as an error: uncaught exceptions, console.error / assert, and the
    browser's own entries of level error (a blocked or missing resource, a policy violation)."""
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
    return errors


def render_in_chromium(page: Path, screenshot: Path | None = None, width: int = 1280) -> list[str]:
    """Open ``page`` in headless Chromium; returns every console error (see ``console_errors``),
    after saving a full-page screenshot to ``screenshot`` when given."""
    with tempfile.TemporaryDirectory(prefix="mecheval-chromium-") as profile:
        tools = _DevTools(chromium(), profile, width)
        try:
            target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                tools.send(f"{domain}.enable", session=session)
            tools.send("Page.navigate", {"url": Path(page).resolve().as_uri()}, session=session)
            tools.wait_for("Page.loadEventFired")
            size = tools.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            if screenshot is not None:
                shot = tools.send("Page.captureScreenshot", {
                    "format": "png", "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}},
                    session=session)
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            tools.send("Runtime.evaluate", {"expression": "1"}, session=session)    # a round trip: late events in
        finally:
            tools.close()
        return console_errors(tools.events)

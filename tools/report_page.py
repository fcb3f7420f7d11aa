#!/usr/bin/env python3
"""Render a validation report to HTML, open it in headless Chromium and check it.

    .venv/bin/python tools/report_page.py reports/sm90/default --screenshot docs/report-screenshot.png

PATH is a report folder, its report.json (rendered with `python -m validate render ... --html`
next to it, bench.json, bench_train.json and stress-*.json included) or an .html page. The page
is loaded through Chromium's DevTools protocol (--remote-debugging-pipe, no network port): it
must load, contain every plot the renderer drew (each <figure class="plot"> holds an <svg> with
a size), log no console error or uncaught exception, and ask for nothing but itself (no network
request, no external script, stylesheet, font or image). Prints what it saw as JSON; exit 0 if
the page is right, 1 if not, 2 for a usage error (no Chromium, no report).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# What the page reports about itself once loaded (run in the page, returns plain JSON).
PROBE = """(() => {
  const figs = [...document.querySelectorAll('figure.plot')];
  return {
    title: document.title,
    figures: figs.length,
    svgs: document.querySelectorAll('svg').length,
    plots: figs.map(f => {
      const svg = f.querySelector('svg');
      const box = svg ? svg.getBoundingClientRect() : null;
      return {id: f.id, svg: !!svg, width: box ? box.width : 0, height: box ? box.height : 0,
              texts: svg ? svg.querySelectorAll('text').length : 0};
    }),
    sections: [...document.querySelectorAll('section[id]')].map(s => s.id),
    external: [...document.querySelectorAll('script[src],link[href],img[src],iframe,object,embed')]
      .map(e => e.outerHTML.slice(0, 200)),
    height: document.documentElement.scrollHeight,
  };
})()"""


class PageError(Exception):
    """A usage problem (no browser, no report); one sentence for the user."""


def find_browser() -> str | None:
    """Chromium from $CHROMIUM or the PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


class DevTools:
    """A Chromium process driven over --remote-debugging-pipe: JSON messages, NUL-terminated,
    written to its fd 3 and read from its fd 4 (here: its stdin and stdout, moved by sh)."""

    def __init__(self, browser: str, profile: Path, width: int, height: int) -> None:
        args = [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
            "--remote-debugging-pipe", f"--user-data-dir={profile}",
            f"--window-size={width},{height}", "about:blank",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            ["sh", "-c", 'exec "$@" 3<&0 4>&1 0</dev/null 1>&2', "sh", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.next_id = 0
        self.buffer = b""
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:  # fmt: skip
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.proc.stdin.write(json.dumps(msg).encode() + b"\0")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result") or {}
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def _read(self, deadline: float) -> dict:
        import select

        fd = self.proc.stdout.fileno()
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited (status {self.proc.poll()})")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def inspect(page: Path, screenshot: Path | None = None, width: int = 1280,
            full_page: bool = True, browser: str | None = None) -> dict:  # fmt: skip
    """Load `page` in headless Chromium; what it saw: the PROBE's answer plus `console` (errors
    and warnings logged, uncaught exceptions), `requests` (every URL the page asked for)."""
    return inspect_all([(page, screenshot)], width, full_page, browser)[0]


def inspect_all(pages: list[tuple[Path, Path | None]], width: int = 1280,
                full_page: bool = True, browser: str | None = None) -> list[dict]:  # fmt: skip
    """inspect() each (page, screenshot or None) in turn, each in a tab of its own in one
    Chromium (started once: its start-up is most of the cost of a page)."""
    browser = browser or find_browser()
    if not browser:
        raise PageError("Chromium is not installed; install it (apt-get install chromium) or set "
                        "CHROMIUM=/path/to/chrome.")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="attnforge-chromium-") as profile:
        dt = DevTools(browser, Path(profile), width, 900)
        try:
            return [_inspect_in(dt, page, shot, width, full_page) for page, shot in pages]
        finally:
            dt.close()


def _inspect_in(dt: DevTools, page: Path, screenshot: Path | None, width: int,
                full_page: bool) -> dict:  # fmt: skip
    url = page.resolve().as_uri()
    target = dt.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = dt.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        dt.send(f"{domain}.enable", session=session)
    dt.events.clear()
    dt.send("Page.navigate", {"url": url}, session=session)
    dt.wait_for("Page.loadEventFired", timeout=60)
    seen = dt.send("Runtime.evaluate", {"expression": PROBE, "returnByValue": True},
                   session=session)["result"]["value"]  # fmt: skip
    if screenshot is not None:
        height = seen["height"] if full_page else 900
        dt.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                "deviceScaleFactor": 1, "mobile": False}, session=session)  # fmt: skip
        png = dt.send("Page.captureScreenshot", {"format": "png"}, session=session)
        tmp = screenshot.with_name(f".{screenshot.name}.tmp")
        tmp.write_bytes(base64.b64decode(png["data"]))
        os.replace(tmp, screenshot)
    # let late console messages arrive (none are expected)
    dt.send("Runtime.evaluate", {"expression": "1"}, session=session)
    events = [ev for ev in dt.events if ev.get("sessionId") in (None, session)]
    dt.send("Target.closeTarget", {"targetId": target})
    console, requests = [], []
    for ev in events:
        m, p = ev.get("method"), ev.get("params") or {}
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
            text = " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])
            )
            console.append(f"console.{p['type']}: {text}")
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails") or {}
            console.append(
                f"exception: {(d.get('exception') or {}).get('description') or d.get('text')}"
            )
        elif m == "Log.entryAdded" and (p.get("entry") or {}).get("level") in ("error", "warning"):
            e = p["entry"]
            console.append(f"log.{e['level']}: {e.get('text')} {e.get('url', '')}".strip())
        elif m == "Network.requestWillBeSent":
            requests.append((p.get("request") or {}).get("url"))
    return {**seen, "url": url, "console": console, "requests": requests}


def problems(seen: dict) -> list[str]:
    """What is wrong with a page, as sentences (empty: the page is right)."""
    out = [f"the console logged {c}" for c in seen["console"]]
    foreign = [u for u in seen["requests"] if u != seen["url"] and not u.startswith("data:")]
    out += [f"the page asked for {u} (it must be self-contained)" for u in foreign]
    out += [f"the page links to an outside resource: {e}" for e in seen["external"]]
    for p in seen["plots"]:
        if not p["svg"] or p["width"] < 50 or p["height"] < 50:
            out.append(f"plot {p['id']} has no visible <svg> ({p['width']}x{p['height']})")
    return out


def palette(png: Path) -> None:
    """Re-save a screenshot with 256 colours (a page of text and flat plots loses nothing seen)."""
    try:
        from PIL import Image
    except ImportError:
        raise PageError(
            "--palette needs Pillow (pip install pillow; matplotlib brings it)."
        ) from None
    tmp = png.with_name(f".{png.name}.tmp")
    with Image.open(png) as im:
        # octree keeps a colour that covers few pixels (a legend patch) that median cut merges
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(
            tmp, format="PNG", optimize=True
        )
    os.replace(tmp, png)


def render(report_json: Path) -> Path:
    """`python -m validate render REPORT --html report.html` next to the report."""
    page = report_json.with_suffix(".html")
    proc = subprocess.run(
        [sys.executable, "-m", "validate", "render", str(report_json), "--html", str(page)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise PageError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else
                        f"rendering {report_json} failed (exit {proc.returncode}).")  # fmt: skip
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )  # fmt: skip
    ap.add_argument("path", help="a report folder, its report.json, or an HTML page")
    ap.add_argument("--screenshot", metavar="PNG", help="also save a PNG of the page here")
    ap.add_argument("--width", type=int, default=1280, help="viewport width in pixels (1280)")
    ap.add_argument("--palette", action="store_true",
                    help="store the screenshot with a 256-colour palette (Pillow; ~1/3 the size)")  # fmt: skip
    ap.add_argument("--viewport-only", action="store_true",
                    help="screenshot the first screen only, not the whole page")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        path = Path(args.path)
        if path.is_dir():
            path = path / "report.json"
        if not path.is_file():
            raise PageError(f"{path}: no such file; give a report folder, report.json or a page.")
        page = path if path.suffix in (".html", ".htm") else render(path)
        shot = Path(args.screenshot) if args.screenshot else None
        seen = inspect(page, shot, args.width, full_page=not args.viewport_only)
        if shot is not None and args.palette:
            palette(shot)
    except PageError as exc:
        print(f"report_page: error: {exc}", file=sys.stderr)
        return 2
    bad = problems(seen)
    print(json.dumps({**seen, "problems": bad}, indent=1))
    print(f"{page}: {seen['figures']} plots, {len(seen['console'])} console messages, "
          + ("OK" if not bad else f"{len(bad)} problem(s)"), file=sys.stderr)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

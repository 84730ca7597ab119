"""Open every page of the built book in headless Chromium and check what a reader sees.

    python scripts/browser_check.py [--build _build/html] [--allow-network]

The pages are served from a local HTTP server and loaded in Chromium through the
DevTools protocol. After MathJax has typeset a page and the widget manager has had
its turn, the script asks the page itself and fails when:

* TeX is left unrendered: a `.math` element without MathJax output, or `$...$`,
  `\\(`, `\\[`, `\\begin{` in the visible text outside code; or Markdown / MyST
  is (an image `![...](...)`, a `:::` fence, a `{cite}` role);
* an image is missing: not loaded, or loaded with no pixels;
* an image in the page's content has no alt text, or alt text that is only its file
  name or path (what the notebook renderer writes when a cell's metadata gives none);
* a figure a code cell produced has no caption: an image in a cell's output that is
  not inside a `<figure>` with a non-empty `<figcaption>`;
* a code cell's code or output scrolls sideways in a window 1200 pixels wide (the
  narrowest with both sidebars): a line wider than the 80 columns the page shows;
* a table or a display equation (a `.math` block, or MathJax's
  `mjx-container[display]` outside one) is clipped or scrolls sideways in that window:
  its own content is wider than its box (`scrollWidth > clientWidth`), the nearest
  ancestor that clips or scrolls (`overflow-x` other than visible) is, or its box
  reaches past the column of the page's content (the article; the main area for a
  block marked `full-width`). The window is narrower than the 1280 pixels a reader's
  laptop often has, so what passes here fits there too;
* an image would look blurred on a high-density screen: at a device pixel ratio of 2
  each CSS pixel of the page is 2 x 2 screen pixels, so an image needs at least 2
  pixels of its own per CSS pixel it is drawn across. The rule: fail when
  `naturalWidth < 2 * rendered width` (1 pixel of slack), that is when its intrinsic
  width at device pixel ratio 2, `naturalWidth / 2`, is less than its rendered width.
  Vector images (SVG), images not shown (a collapsed cell: rendered width 0) and icons
  (rendered under 64 pixels wide or 40 tall, such as the Colab badge) are left out;
* a request to the local server failed: an HTTP status of 400 or more (a file not
  found), or a network error; each one is listed;
* a notebook page lacks its Colab button (the launch link in the page header);
* a widget placeholder was not rendered into a widget;
* the page threw an uncaught JavaScript exception.

When `_static_offline/manifest.json` exists (`make static` ran), every request that
leaves the local server is refused, as on a machine with no network, and each one is
reported: the book must render offline. `--allow-network` (and the CDN fallback,
without that folder) lets such requests through.

No Chromium on the machine: the script says so and exits 0 (install it with `make
setup` where apt is available). Needs `websocket-client` (installed with Jupyter).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--remote-allow-origins=*", "--remote-debugging-port=0",
]
PAGE_TIMEOUT_S = 30.0
# The window the pages are checked in: the narrowest that shows both of the theme's
# sidebars, where a code cell has the least room (book/_ext/code_width.py).
WINDOW = {"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": False}

# Runs inside each page once it has loaded; returns a JSON report.
PAGE_REPORT_JS = r"""
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  // The widget manager renders on the load event, asynchronously: give it up to 15 s.
  const placeholders = () => [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const rendered = (s) => { const d = s.previousElementSibling;
    return !!d && d.classList.contains('widget-subarea') && d.children.length > 0; };
  for (let i = 0; i < 150 && !placeholders().every(rendered); i++) { await sleep(100); }
  await sleep(200);
  const skip = (el) => el.closest('pre, code, script, style, mjx-container, .highlight, .output, textarea');
  const walker = document.createTreeWalker(document.querySelector('main') || document.body, NodeFilter.SHOW_TEXT);
  const rawTex = [], rawMarkdown = [];
  const pattern = /\$[^$\s][^$]*\$|\\\(|\\\[|\\begin\{|\$\$/;
  const markdown = /!\[[^\]]*\]\(|^\s*:::|\{(cite|doc|ref|eq)\}`/;
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (!node.parentElement || skip(node.parentElement)) { continue; }
    if (pattern.test(node.textContent)) { rawTex.push(node.textContent.trim().slice(0, 80)); }
    if (markdown.test(node.textContent)) { rawMarkdown.push(node.textContent.trim().slice(0, 80)); }
  }
  const math = [...document.querySelectorAll('.math')];
  const untypeset = math.filter((m) => !m.querySelector('mjx-container')).map((m) => m.textContent.trim().slice(0, 80));
  const images = [...document.images];
  const broken = images.filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.src.slice(0, 120));
  // Alt text: present, and more than the image's file name or path.
  const content = document.querySelector('article') || document.querySelector('main') || document.body;
  const fileLike = /\.(png|jpe?g|gif|svg|webp)$/i;
  const badAlt = (i) => { const alt = (i.getAttribute('alt') || '').trim(), src = i.getAttribute('src') || '';
    return !alt || alt === src || fileLike.test(alt) || (!src.startsWith('data:') && src.endsWith(alt)); };
  const noAlt = [...content.querySelectorAll('img')].filter(badAlt)
    .map((i) => `${(i.getAttribute('src') || '').slice(0, 60)} (alt ${JSON.stringify(i.getAttribute('alt'))})`);
  // Figures made by code cells: every output image sits in a <figure> with a caption.
  const captioned = (i) => { const f = i.closest('figure'); const c = f && f.querySelector('figcaption');
    return !!c && c.textContent.trim().length > 0; };
  const uncaptioned = [...content.querySelectorAll('.cell_output img, .output img')].filter((i) => !captioned(i))
    .map((i) => (i.getAttribute('alt') || i.getAttribute('src') || '').slice(0, 60));
  const launch = 'a[href^="https://colab.research.google.com/github/"]';
  const header = document.querySelectorAll(`.article-header-buttons ${launch}, .header-article ${launch}`);
  const colab = [...header].map((a) => a.href);
  // Code and outputs that scroll sideways: name each by its widest line.
  const widest = (text) => text.split('\n').reduce((a, b) => (b.length > a.length ? b : a), '');
  const scrolling = [...content.querySelectorAll('div.cell div.highlight > pre')]
    .filter((p) => p.scrollWidth > p.clientWidth + 1)
    .map((p) => `${widest(p.textContent).length} characters: ${JSON.stringify(widest(p.textContent).slice(0, 50))}`);
  // Tables and display equations: clipped, scrolling sideways, or past the column.
  const clipper = (el) => {
    for (let a = el.parentElement; a && a !== content.parentElement; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') { return a; }
    }
    return null;
  };
  const columnOf = (el) => ((el.closest('.full-width') && document.querySelector('.bd-main, main')) || content)
    .getBoundingClientRect();
  const overflow = (el) => {
    const box = el.getBoundingClientRect();
    if (box.width === 0) { return null; }  // not shown (a collapsed cell)
    if (el.scrollWidth > el.clientWidth + 1) { return `scrolls sideways (${el.scrollWidth} > ${el.clientWidth} px)`; }
    const c = clipper(el);
    if (c && c.scrollWidth > c.clientWidth + 1) {
      return `its container scrolls or clips (${c.scrollWidth} > ${c.clientWidth} px)`;
    }
    const column = columnOf(el);
    if (box.right > column.right + 1 || box.left < column.left - 1) {
      return `reaches ${Math.round(Math.max(box.right - column.right, column.left - box.left))} px past the column`;
    }
    return null;
  };
  const tex = (el) => {
    try {
      const items = MathJax.startup.document.getMathItemsWithin(el);
      if (items.length) { return items[0].math.trim().replace(/\s+/g, ' ').slice(0, 60); }
    } catch (e) { /* no MathJax: fall back to the text */ }
    return el.textContent.trim().replace(/\s+/g, ' ').slice(0, 60);
  };
  const equations = [...content.querySelectorAll('div.math, mjx-container[display]')]
    .filter((m) => m.matches('div.math') || !m.closest('div.math'));
  const clipped = [
    ...[...content.querySelectorAll('table')].map((t) => [t, 'table', ((t.querySelector('caption, th, td') || t)
      .textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60)]),
    ...equations.map((m) => [m, 'display equation', tex(m)]),
  ].map(([el, kind, name]) => {
    // An equation is checked as a block and as MathJax's container inside it (which scrolls).
    const inner = el.matches('div.math') ? el.querySelector('mjx-container') : null;
    const why = overflow(el) || (inner && overflow(inner));
    return why && `${kind} ${JSON.stringify(name)}: ${why}`;
  }).filter(Boolean);
  // Images drawn wider than half their pixel width: blurred at device pixel ratio 2.
  const vector = (i) => { const src = i.currentSrc || i.src;
    return /\.svg(\?|#|$)/i.test(src) || src.startsWith('data:image/svg'); };
  const blurry = [...content.querySelectorAll('img')].filter((i) => {
    const box = i.getBoundingClientRect();
    if (box.width < 64 || box.height < 40 || vector(i) || !i.naturalWidth) { return false; }
    return i.naturalWidth < 2 * box.width - 1;
  }).map((i) => `${(i.getAttribute('alt') || i.getAttribute('src') || '').slice(0, 60)}: ${i.naturalWidth} px `
    + `drawn ${Math.round(i.getBoundingClientRect().width)} px wide`);
  return JSON.stringify({
    title: document.title, math: math.length, untypeset, rawTex, rawMarkdown, images: images.length, broken, colab,
    noAlt, uncaptioned, scrolling, clipped, blurry,
    widgets: placeholders().length, unrenderedWidgets: placeholders().filter((s) => !rendered(s)).length,
    mathjax: !!(window.MathJax && MathJax.version),
  });
})()
"""


class Chromium:
    """A headless Chromium driven over the DevTools protocol (one tab)."""

    def __init__(self, binary: str, allow_network: bool, local_host: str) -> None:
        import websocket  # websocket-client, a Jupyter dependency

        self.profile = tempfile.mkdtemp(prefix="browser-check-")
        # Chromium's own temporary files go into the profile too, removed with it on close.
        self.process = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env={**os.environ, "TMPDIR": self.profile})
        port = self._devtools_port()
        tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in tabs if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=PAGE_TIMEOUT_S,
                                             suppress_origin=True)
        self.next_id = 0
        self.allow_network = allow_network
        self.local_host = local_host
        self.events: list[dict] = []
        self.refused: list[str] = []
        self.exceptions: list[str] = []
        self.requests: dict[str, str] = {}  # request id -> URL, for the failures below
        self.failed: list[str] = []  # local requests that failed: "404 http://..." or "net::ERR_... http://..."
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", WINDOW)
        # Watch every response: a local file that is not found is a failure of the book.
        self.call("Network.enable")
        # Intercept every request: local ones go through, others are refused unless allowed.
        self.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})

    def _devtools_port(self) -> int:
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.process.poll() is not None:
                raise RuntimeError(f"Chromium exited with status {self.process.returncode} before it started")
            time.sleep(0.1)
        raise RuntimeError("Chromium did not open its DevTools port within 30 s")

    def send(self, method: str, params: dict | None = None) -> int:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params or {}}))
        return self.next_id

    def call(self, method: str, params: dict | None = None) -> dict:
        """Send a command and pump events until its answer arrives."""
        wanted = self.send(method, params)
        while True:
            message = self.pump()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def pump(self) -> dict:
        """Read one message; answer paused requests and record exceptions on the way."""
        message = json.loads(self.ws.recv())
        method = message.get("method")
        if method == "Fetch.requestPaused":
            request_id, url = message["params"]["requestId"], message["params"]["request"]["url"]
            host = urlparse(url).hostname
            if self.allow_network or host == self.local_host or urlparse(url).scheme in ("data", "blob"):
                self.send("Fetch.continueRequest", {"requestId": request_id})
            else:
                self.refused.append(url)
                self.send("Fetch.failRequest", {"requestId": request_id, "errorReason": "InternetDisconnected"})
        elif method == "Network.requestWillBeSent":
            self.requests[message["params"]["requestId"]] = message["params"]["request"]["url"]
        elif method == "Network.responseReceived":
            response = message["params"]["response"]
            if self._local(response["url"]) and response["status"] >= 400:
                self.failed.append(f"HTTP {response['status']} {response['url']}")
        elif method == "Network.loadingFailed":
            params = message["params"]
            url = self.requests.get(params["requestId"], "")
            if self._local(url) and not params.get("canceled"):
                self.failed.append(f"{params.get('errorText', 'failed')} {url}")
        elif method == "Runtime.exceptionThrown":
            details = message["params"]["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.exceptions.append(text.splitlines()[0][:160] if text else "(no description)")
        elif method:
            self.events.append(message)
        return message

    def _local(self, url: str) -> bool:
        """Whether `url` asks the local server (not data:, blob: or another host).

        `/favicon.ico` is left out: the browser asks for it by itself, whatever the page says.
        """
        parsed = urlparse(url)
        return (parsed.scheme in ("http", "https") and parsed.hostname == self.local_host
                and parsed.path != "/favicon.ico")

    def open(self, url: str) -> dict:
        """Load `url`, wait for its load event, and return the page's report."""
        self.events.clear()
        self.refused.clear()
        self.exceptions.clear()
        self.requests.clear()
        self.failed.clear()
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not finish loading within {PAGE_TIMEOUT_S:.0f} s")
            self.pump()
        result = self.call("Runtime.evaluate", {"expression": PAGE_REPORT_JS, "awaitPromise": True,
                                                "returnByValue": True, "timeout": PAGE_TIMEOUT_S * 1000})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{url}: the page report failed: {result['exceptionDetails']}")
        report = json.loads(result["result"]["value"])
        report["refused"] = list(dict.fromkeys(self.refused))
        report["exceptions"] = list(self.exceptions)
        report["failed"] = list(dict.fromkeys(self.failed))
        return report

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    """Serve `folder` on 127.0.0.1 at a free port, in a background thread."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass


def book_pages(build: Path) -> list[tuple[str, bool]]:
    """(page path, is a notebook page) for every HTML page of the book, redirects left out."""
    pages = []
    for path in sorted(build.rglob("*.html")):
        relative = path.relative_to(build).as_posix()
        if relative.split("/")[0] in {"_static", "_sources", "_images"}:
            continue
        if 'http-equiv="Refresh"' in path.read_text(errors="replace")[:2000]:
            continue  # index.html only redirects to the root page
        notebook = (build / "_sources" / relative).with_suffix(".ipynb").is_file()
        pages.append((relative, notebook))
    return pages


def problems(page: str, notebook: bool, report: dict, offline: bool) -> list[str]:
    """What is wrong with one page's report (empty: the page is fine)."""
    found = []
    if report["untypeset"]:
        found.append(f"{len(report['untypeset'])} math elements not typeset, e.g. {report['untypeset'][0]!r}")
    if report["rawTex"]:
        found.append(f"raw TeX in the text, e.g. {report['rawTex'][0]!r}")
    if report["rawMarkdown"]:
        found.append(f"Markdown left unrendered, e.g. {report['rawMarkdown'][0]!r}")
    if report["math"] and not report["mathjax"]:
        found.append("MathJax did not load")
    if report["broken"]:
        found.append(f"{len(report['broken'])} missing images, e.g. {report['broken'][0]}")
    found += [f"image without alt text (or only its file name): {image}" for image in report["noAlt"]]
    found += [f"figure without a caption: {image}" for image in report["uncaptioned"]]
    found += [f"scrolls sideways, a line of {line}" for line in report["scrolling"]]
    found += [f"clipped or scrolls sideways: {what}" for what in report.get("clipped", [])]
    found += [f"blurred at device pixel ratio 2 (needs 2 pixels per CSS pixel): {image}"
              for image in report.get("blurry", [])]
    found += [f"local request failed: {failure}" for failure in report["failed"]]
    if notebook and not any(link.endswith(page.removesuffix(".html") + ".ipynb") for link in report["colab"]):
        found.append("no Colab launch button in the page header")
    if report["unrenderedWidgets"]:
        found.append(f"{report['unrenderedWidgets']} of {report['widgets']} widgets not rendered")
    if report["exceptions"]:
        found.append(f"JavaScript exception: {report['exceptions'][0]}")
    if offline and report["refused"]:
        found.append(f"{len(report['refused'])} requests left the machine, e.g. {report['refused'][0]}")
    return found


def find_browser() -> str | None:
    """The first Chromium-like browser on PATH (or $CHROMIUM)."""
    candidates = [os.environ.get("CHROMIUM", ""), *BROWSERS]
    return next((shutil.which(c) for c in candidates if c and shutil.which(c)), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, default=ROOT / "_build" / "html", help="the built HTML book")
    parser.add_argument("--allow-network", action="store_true", help="let pages reach the network (CDN fallback)")
    args = parser.parse_args(argv)

    browser = find_browser()
    if browser is None:
        print("browser check: skipped, no Chromium on this machine (`make setup` installs it where apt exists)")
        return 0
    if not (args.build / "index.html").is_file():
        print(f"browser check: no built book at {args.build} (run `make book` first)", file=sys.stderr)
        return 1
    offline = (ROOT / "_static_offline" / "manifest.json").is_file() and not args.allow_network
    pages = book_pages(args.build)
    server, port = serve(args.build)
    chromium = Chromium(browser, allow_network=not offline, local_host="127.0.0.1")
    failures = 0
    start = time.monotonic()
    try:
        for page, notebook in pages:
            report = chromium.open(f"http://127.0.0.1:{port}/{page}")
            found = problems(page, notebook, report, offline)
            failures += bool(found)
            summary = (f"{report['math']} math, {report['images']} images, {report['widgets']} widgets"
                       + (", Colab button" if report["colab"] else ""))
            print(f"{'FAIL' if found else 'ok  '} {page}: {summary}")
            for problem in found:
                print(f"       - {problem}")
    finally:
        chromium.close()
        server.shutdown()
    mode = "offline" if offline else "network allowed"
    print(f"browser check: {len(pages)} pages, {failures} failing ({mode}, {time.monotonic() - start:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

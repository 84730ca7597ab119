"""Open every page of the built book in headless Chromium and check what a reader sees.

    python scripts/browser_check.py [--build _build/html] [--allow-network]

The pages are served from a local HTTP server and loaded with Playwright in the system's
Chromium (`make setup` installs it with apt; Playwright's own browser download is not
used). After MathJax has typeset a page and the widget manager has had its turn, the
script asks the page itself and fails when:

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
* an image would look blurred on a high-density screen: at device pixel ratio 2 it needs
  2 pixels of its own per CSS pixel it is drawn across, so it fails when `naturalWidth
  < 2 * rendered width - 1`. Vector images (SVG), images not shown (a collapsed cell:
  rendered width 0) and icons (drawn under 64 x 40 pixels, such as the Colab badge) are
  left out;
* a request to the local server failed: an HTTP status of 400 or more (a file not
  found), or a network error; each one is listed;
* a notebook page lacks its Colab button (the launch link in the page header);
* a widget placeholder was not rendered into a widget;
* the page threw an uncaught JavaScript exception.

It fails a page whose printed table is split into one output block per `print`
(SPLIT_TABLES_FAIL; False makes that a warning), and warns (a WARNING line, not a
failure) when a page is taller than MAX_PAGE_HEIGHT at 1280 pixels wide (the reason
is beside it).

When `_static_offline/manifest.json` exists (`make static` ran), every request that
leaves the local server is refused, as on a machine with no network, and each one is
reported: the book must render offline. `--allow-network` (and the CDN fallback,
without that folder) lets such requests through.

No Chromium on the machine: the script says so and exits 0 (install it with `make
setup` where apt is available). Needs `playwright` (the [dev] extra).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
PAGE_TIMEOUT_MS = 30_000
# The window the pages are checked in: the narrowest that shows both of the theme's
# sidebars, where a code cell has the least room (book/_ext/code_width.py).
WINDOW = {"width": 1200, "height": 900}
# A page's length is measured at a laptop's 1280 pixels. The limit, 25,000 px, is 25 to 35
# screens of a window 1000 to 700 pixels high (such a laptop less the browser's bars):
# more than one sitting, and past it a reader loses their place (issue 31 found chapter 6,
# at 44,000 px, reads so). A longer page is better split into two that link each other.
READING_WIDTH = 1280
MAX_PAGE_HEIGHT = 25_000
# Whether a table split over several output blocks fails the page (True) or warns.
# Every chapter prints its tables as one block (issue 31, item 16): a new split fails.
SPLIT_TABLES_FAIL = True

# Runs inside each page once it has loaded; returns the page's report.
PAGE_REPORT_JS = r"""
async () => {
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
  // A printed table split into one grey box per print: consecutive stream outputs of a cell
  // whose every line looks like a table row (columns apart by 2+ spaces, or padded).
  const rowLike = (el) => el.matches('.output.stream') && el.textContent.split('\n').filter((l) => l.trim())
    .every((l) => /\S {2,}\S/.test(l.trimEnd()) || /^ +\S/.test(l));
  const splitTables = [];
  for (const out of content.querySelectorAll('.cell_output')) {
    [...out.children, null].reduce((run, el) => {
      if (el && rowLike(el)) { return [...run, el]; }
      const first = run.length > 1 && run[0].textContent.trim().split('\n')[0].slice(0, 50);
      if (first) { splitTables.push(`${run.length} output blocks: ${JSON.stringify(first)}`); }
      return [];
    }, []);
  }
  return {
    title: document.title, math: math.length, untypeset, rawTex, rawMarkdown, images: images.length, broken, colab,
    noAlt, uncaptioned, scrolling, clipped, blurry, splitTables,
    widgets: placeholders().length, unrenderedWidgets: placeholders().filter((s) => !rendered(s)).length,
    mathjax: !!(window.MathJax && MathJax.version),
  };
}
"""


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
    if SPLIT_TABLES_FAIL:
        found += [f"table split over {split}" for split in report.get("splitTables", [])]
    return found


def warnings(report: dict) -> list[str]:
    """What a reader would rather not meet on one page, but that does not fail it."""
    found = []
    if report.get("height", 0) > MAX_PAGE_HEIGHT:
        found.append(f"{report['height']:,} px tall at {READING_WIDTH} px wide (limit {MAX_PAGE_HEIGHT:,} px)")
    if not SPLIT_TABLES_FAIL:
        found += [f"table split over {split}" for split in report.get("splitTables", [])]
    return found


def find_browser() -> str | None:
    """The first Chromium-like browser on PATH (or $CHROMIUM)."""
    candidates = [os.environ.get("CHROMIUM", ""), *BROWSERS]
    return next((shutil.which(c) for c in candidates if c and shutil.which(c)), None)


def local(url: str) -> bool:
    """Whether `url` asks the local server; `/favicon.ico` is left out (the browser asks for it itself)."""
    parsed = urlparse(url)
    return parsed.scheme in ("http", "https") and parsed.hostname == "127.0.0.1" and parsed.path != "/favicon.ico"


def check_pages(browser: str, base: str, pages: list[tuple[str, bool]], offline: bool) -> tuple[int, int]:
    """Open each page in one tab, print what is wrong with it; return (pages failing, warnings)."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, list[str]] = {"refused": [], "exceptions": [], "failed": []}

    def refuse(route) -> None:  # offline: a request to another host is refused and listed
        seen["refused"].append(route.request.url)
        route.abort("internetdisconnected")

    def response(r) -> None:
        if local(r.url) and r.status >= 400:
            seen["failed"].append(f"HTTP {r.status} {r.url}")

    def request_failed(request) -> None:  # a request the page itself cancelled is not a failure
        if local(request.url) and request.failure != "net::ERR_ABORTED":
            seen["failed"].append(f"{request.failure} {request.url}")

    failures = warned = 0
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=browser, args=CHROMIUM_FLAGS)
        context = chromium.new_context(viewport=WINDOW, device_scale_factor=1)
        if offline:
            context.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/])"), refuse)  # all but the local server
        tab = context.new_page()
        tab.on("pageerror", lambda e: seen["exceptions"].append((e.stack or e.message or "?").splitlines()[0][:160]))
        tab.on("response", response)
        tab.on("requestfailed", request_failed)
        for page, notebook in pages:
            for events in seen.values():
                events.clear()
            tab.set_viewport_size(WINDOW)
            tab.goto(f"{base}/{page}", wait_until="load", timeout=PAGE_TIMEOUT_MS)
            report = tab.evaluate(PAGE_REPORT_JS)
            tab.set_viewport_size({"width": READING_WIDTH, "height": WINDOW["height"]})
            report["height"] = tab.evaluate("document.documentElement.scrollHeight")
            report.update({key: list(dict.fromkeys(events)) for key, events in seen.items()})
            found, warn = problems(page, notebook, report, offline), warnings(report)
            failures += bool(found)
            warned += len(warn)
            summary = (f"{report['math']} math, {report['images']} images, {report['widgets']} widgets"
                       + (", Colab button" if report["colab"] else "") + f", {report['height']:,} px tall")
            print(f"{'FAIL' if found else 'ok  '} {page}: {summary}")
            for problem in found:
                print(f"       - {problem}")
            for warning in warn:
                print(f"WARNING {page}: {warning}")
        chromium.close()
    return failures, warned


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
    start = time.monotonic()
    try:
        failures, warned = check_pages(browser, f"http://127.0.0.1:{port}", pages, offline)
    finally:
        server.shutdown()
    mode = "offline" if offline else "network allowed"
    print(f"browser check: {len(pages)} pages, {failures} failing, {warned} warnings "
          f"({mode}, {time.monotonic() - start:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

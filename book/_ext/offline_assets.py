"""Serve MathJax and the ipywidgets manager from the built book instead of a CDN.

Sphinx and myst-nb load MathJax, RequireJS and `@jupyter-widgets/html-manager` from
CDNs by default, so a reader without network sees raw TeX and no widgets. `make
static` (scripts/fetch_static_assets.py) installs the three from the npm registry
into `_static_offline/` (not committed). When that folder holds them, this extension
adds it to `html_static_path` and points `mathjax_path` and `nb_ipywidgets_js` at the
copies inside `_static/`; when it does not (no npm on the machine), the CDN defaults
stay, and the build says so.

The widget manager's stylesheets load their icon fonts from a folder each bundled
module derives from its own RequireJS module URI: for `@jupyter-widgets/html-manager/
dist/libembed-amd`, `<page folder>/@jupyter-widgets/html-manager/dist/`, which does not
exist (and its `window.__jupyter_widgets_assets_path__` override is read only after the
stylesheets are in place). So each page configures RequireJS, before it loads, to place
every module of the bundle in `_static/html-manager/`, where `make static` put the fonts.
"""

from __future__ import annotations

import json
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

# The folder `make static` fills, relative to the book's root (the Sphinx confdir).
STATIC_DIR = "_static_offline"
# Files inside that folder, as they appear under `_static/` in the built book.
MATHJAX = "mathjax/tex-chtml.js"
REQUIREJS = "requirejs/require.js"
WIDGETS = "html-manager/embed-amd.js"
# Non-core widget libraries (none in this book) would still come from this CDN.
WIDGETS_CDN = "https://cdn.jsdelivr.net/npm/"
# The AMD modules `embed-amd.js` defines; each finds its fonts next to its module URI.
WIDGET_MODULES = ("base", "base7", "controls", "controls7", "html-manager", "html-manager/dist/libembed-amd")
# RequireJS reads a global `require` object as its configuration when it loads. Every
# module is mapped to the manager's own script (`.js` is appended), so its URI's folder
# is `_static/html-manager/` on every page, at any depth (Sphinx's data-content_root).
REQUIRE_CONFIG_JS = """(function () {
  var root = document.documentElement.getAttribute("data-content_root") || "";
  var manager = new URL(root + "_static/MANAGER", document.baseURI).href;
  var paths = {};
  MODULES.forEach(function (name) { paths["@jupyter-widgets/" + name] = manager; });
  if (typeof window.requirejs === "function") { window.requirejs.config({paths: paths}); }
  else { window.require = {paths: paths}; }
})();""".replace("MANAGER", WIDGETS.removesuffix(".js")).replace("MODULES", json.dumps(list(WIDGET_MODULES)))


def offline_assets_present(root: Path) -> bool:
    """Whether `_static_offline/` holds real copies of all three assets.

    scripts/fetch_static_assets.py writes `manifest.json` last, after copying, so a
    half-finished copy does not count.
    """
    folder = root / STATIC_DIR
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return False
    files = json.loads(manifest.read_text()).get("files", [])
    return set(files) >= {MATHJAX, REQUIREJS, WIDGETS} and all((folder / f).is_file() for f in files)


def use_offline_assets(app: Sphinx, config: Config) -> None:
    """Point MathJax and the widget manager at the local copies when they exist."""
    root = Path(app.confdir)
    if not offline_assets_present(root):
        LOGGER.info("offline_assets: %s/ has no assets (run `make static`); MathJax and widgets load from the CDN",
                    STATIC_DIR)
        return
    config.html_static_path = [*config.html_static_path, STATIC_DIR]
    config.mathjax_path = MATHJAX
    # myst-nb adds these scripts, in this order, to pages that hold widgets.
    config.nb_ipywidgets_js = {
        REQUIREJS: {},
        WIDGETS: {"data-jupyter-widgets-cdn": WIDGETS_CDN},
    }
    # Before RequireJS (myst-nb adds it at the default priority, 500).
    app.add_js_file(None, body=REQUIRE_CONFIG_JS, priority=200)
    LOGGER.info("offline_assets: MathJax and the widget manager are served from _static/")


def setup(app: Sphinx) -> dict:
    # Run before myst-nb and sphinx.ext.mathjax read these values (they do so later,
    # at builder-inited and html-page-context).
    app.connect("config-inited", use_offline_assets, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

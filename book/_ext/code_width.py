"""Fit 80 columns of code and output on the page at every window width.

The notebooks keep every code line and printed line within 80 characters so that a
reader never scrolls sideways. With both sidebars shown (windows of about 1200 to 1400
pixels), sphinx-book-theme leaves a code cell room for only 68 to 80 characters of its
14 px monospace font. `static/code_width.css` shrinks the font of a cell's code and
output blocks to what 80 characters need on the cell's own width, within 11 to 14 px;
scripts/browser_check.py fails on any block that still scrolls.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config

STATIC = Path(__file__).parent / "static"
CSS = "code_width.css"


def add_static_folder(app: Sphinx, config: Config) -> None:
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", add_static_folder)
    app.add_css_file(CSS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

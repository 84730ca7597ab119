"""Give the images a saved widget draws the alt text its cell's metadata names.

A code cell states its figure's alt text in its metadata (`"mystnb": {"image": {"alt":
...}}`). myst-nb applies it to image outputs, but a widget output is a placeholder that
the widget manager replaces with the widget in the reader's browser, so an image the
widget draws (a plot inside an `Output` widget) would have no alt text at all. This
extension stores the cell's alt text next to each widget placeholder, and a small
script sets it on every image the widget manager draws there without one.
"""

from __future__ import annotations

import json

from docutils import nodes
from sphinx.application import Sphinx

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Runs on every page; does nothing where no widget has alt text stored.
SCRIPT = """document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("script.widget-image-alt").forEach(function (data) {
    var alt = JSON.parse(data.textContent), scope = data.parentElement;
    var label = function () {
      scope.querySelectorAll("img:not([alt])").forEach(function (img) { img.alt = alt; });
    };
    label();
    new MutationObserver(label).observe(scope, {childList: true, subtree: true});
  });
});"""


def cell_image_alt(metadata: dict) -> str | None:
    """The alt text a cell's metadata gives its images (`mystnb.image.alt`), if any."""
    alt = metadata.get("mystnb", {}).get("image", {}).get("alt")
    return alt.strip() if isinstance(alt, str) and alt.strip() else None


def store_widget_alt(app: Sphinx, doctree: nodes.document) -> None:
    """Put each code cell's alt text beside the widget placeholders in its output."""
    for cell in doctree.findall(nodes.container):
        if cell.get("nb_element") != "cell_code":
            continue
        alt = cell_image_alt(cell.get("cell_metadata") or {})
        if alt is None:
            continue
        for raw in list(cell.findall(nodes.raw)):
            if WIDGET_VIEW in raw.astext() and "html" in raw.get("format", ""):
                # JSON in a script element; "</" escaped so that it cannot close the element.
                text = json.dumps(alt).replace("</", "<\\/")
                data = nodes.raw("", f'<script type="application/json" class="widget-image-alt">{text}</script>',
                                 format="html")
                raw.parent.insert(raw.parent.index(raw) + 1, data)


def setup(app: Sphinx) -> dict:
    app.connect("doctree-read", store_widget_alt)
    app.add_js_file(None, body=SCRIPT)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

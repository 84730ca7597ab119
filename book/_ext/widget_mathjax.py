"""Let the ipywidgets manager typeset labels with MathJax 3.

The widget manager that renders saved widgets in a static page
(`@jupyter-widgets/html-manager` 1.x) typesets widget labels with the MathJax 2 call
`MathJax.Hub.Queue(...)`. Sphinx loads MathJax 3, which has no `Hub`, so every widget
label raises a TypeError. This adds a small `Hub.Queue` that forwards to MathJax 3's
`typesetPromise`, installed once MathJax 3 has replaced its configuration object
(deferred scripts run before DOMContentLoaded; the widgets render on load).
"""

from __future__ import annotations

from sphinx.application import Sphinx

SHIM = """document.addEventListener("DOMContentLoaded", function () {
  var mj = window.MathJax;
  if (!mj || mj.Hub || !mj.typesetPromise) { return; }
  mj.Hub = {Queue: function (job) {
    var element = job && job[2];
    if (element) { mj.startup.promise.then(function () { return mj.typesetPromise([element]); }); }
  }};
});"""


def setup(app: Sphinx) -> dict:
    app.add_js_file(None, body=SHIM)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

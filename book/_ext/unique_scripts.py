"""Drop repeated <script> tags from every page.

Under Sphinx 7.4, sphinx-thebe 0.3.1 (loaded by Jupyter Book 1) registers its inline
configuration script twice, so each page declares `const THEBE_JS_URL` twice and the
browser reports a SyntaxError. This keeps the first of any identical scripts (same
file, attributes and body, whatever their priority); distinct scripts are untouched.
Inline scripts are the ones affected: Sphinx records them once with the file name
None and once with "" (the same happens to sphinx-togglebutton's selector script).
"""

from __future__ import annotations

from sphinx.application import Sphinx


def unique_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        # An inline script is registered once with filename None and once with "".
        name = str(getattr(script, "filename", script) or "")
        key = (name, tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    # A new list: Sphinx restores its own list between pages.
    context["script_files"] = kept


def setup(app: Sphinx) -> dict:
    # After the other extensions have added their scripts for the page.
    app.connect("html-page-context", unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

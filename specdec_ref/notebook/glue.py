"""Glue a computed value into a chapter's page, so that its prose quotes the output.

A chapter calls `glue("name", value)` in a code cell and writes {glue:text}`name:.2f` in
its markdown; Jupyter Book (myst-nb) puts the stored value in the sentence, and
`scripts/claims.py` reads the same record for the claims appendix. The record is the one
myst-nb's own `glue` writes (a display_data output of mime type
`application/papermill.record/text/plain`, named in `metadata.scrapbook`); this copy
needs only IPython, so a chapter also runs where myst-nb is not installed (Colab).

Invariant: glue values that do not depend on float noise or the thread count (round
them), or glue from a cell tagged `nbval-ignore-output`: nbval compares the records.
"""

from __future__ import annotations

from typing import Any

# myst-nb's prefix for a value stored without being shown.
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store `value` in the cell's outputs under `name` (shown too if `display`).

    Args:
        name: the name the markdown uses, lowercase snake_case, unique in the notebook.
        value: the value; its text form (`repr`) is what the page shows.
        display: also show the value in the cell's output.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipy_display

    bundle, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    ipy_display({prefix + key: text for key, text in bundle.items()}, raw=True, metadata=metadata)

"""The measured results the chapters read, shipped inside the package.

Chapters 4, 6 and 7 draw committed measurements (the exactness audit, the benchmark,
the size sweeps, prompt lookup, batched throughput) that took minutes to hours to
produce. They live in `specdec_ref/data/` as JSON and travel with the package (listed
in pyproject.toml's package-data), so a notebook that `pip install`ed the package on
Colab finds them as surely as one run from a checkout.

Invariant: a report is found through `importlib.resources`, never through a path
relative to a notebook or to the repository, so the same call works from a checkout
(editable install) and from an installed wheel.

The scripts that write reports (`scripts/batched_throughput.py`, `python -m
specdec_ref.bench`, chapter 6 with `SPECDEC_FULL=1`) write into `REPORTS_DIR`; in a
checkout that is the tracked folder, so `git diff` shows what a new run changed.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

# The package folder that holds the reports (a checkout's tracked copy in an editable install).
REPORTS_DIR = Path(__file__).resolve().parent / "data"


def _folder():
    """The reports folder as importlib.resources sees it (a Traversable)."""
    return resources.files("specdec_ref").joinpath("data")


def report_names(pattern: str = "*.json") -> list[str]:
    """The names of the shipped reports that match a glob `pattern`, sorted."""
    from fnmatch import fnmatch

    return sorted(entry.name for entry in _folder().iterdir() if entry.is_file() and fnmatch(entry.name, pattern))


def report_path(name: str) -> Path:
    """The file of the report called `name` (e.g. "bench-tiny-cpu.json").

    Raises:
        FileNotFoundError: if the package ships no report of that name (the message lists those it has).
    """
    entry = _folder().joinpath(name)
    if not entry.is_file():
        raise FileNotFoundError(f"specdec_ref ships no report named {name!r}; it has: {', '.join(report_names())}")
    # Installed packages are plain folders (wheels unpack), so the entry is a real file.
    return Path(str(entry))


def read_report(name: str) -> Any:
    """The parsed JSON of the report called `name`."""
    return json.loads(report_path(name).read_text())


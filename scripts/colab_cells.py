"""Keep every chapter's Open-in-Colab badge and set-up cell in step with _config.yml.

    python scripts/colab_cells.py --check   # exit 1 and name each notebook that differs
    python scripts/colab_cells.py --write   # rewrite the badge line and the set-up cell

`_config.yml` names the repository and branch once (`repository.url`,
`repository.branch`); the book's header buttons are built from it, and this script
writes the same values into each notebook under `notebooks/`:

* the badge: a line in the first (title) cell, linking to the notebook on Colab. The
  image (book/images/colab-badge.png) is inlined, so it shows offline and anywhere;
* the set-up cell (tagged `colab-setup`, the first code cell): on Colab only, it
  installs the package from the repository; then it picks and loads the model pair,
  and says which and why;
* the "On Colab" note (tagged `colab-note`, the cell right after the set-up cell): what
  a Colab reader should expect, the pair loaded, the download each fresh runtime
  repeats, and a predicted time on a T4 with its basis (the chapter's passes, counted
  by scripts/colab_passes.py into book/data/colab-passes.json, at the step times of
  the H200 sweep in specdec_ref/data/size-sweep-cuda.json);
* the notebook's metadata asks Colab for a GPU runtime (a T4, the free tier's), so
  "Open in Colab" starts where the article's pair runs, not on a CPU.

Standard library and PyYAML (a Jupyter Book dependency) only.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SETUP_TAG = "colab-setup"
BADGE_ALT = "Open in Colab"
COLAB = "https://colab.research.google.com"

# The badge image, embedded as a data URI so that it shows offline, in the built book
# and on Colab without fetching anything (Markdown renderers accept PNG data URIs, not SVG).
BADGE_PNG = ROOT / "book" / "images" / "colab-badge.png"


def repository(config_path: Path = ROOT / "_config.yml") -> tuple[str, str]:
    """(url, branch) from the book configuration; the url must be a GitHub repository."""
    config = yaml.safe_load(config_path.read_text())
    url = config["repository"]["url"].rstrip("/")
    branch = config["repository"]["branch"]
    if not url.startswith("https://github.com/") or url.count("/") != 4:
        raise ValueError(f"repository.url must look like https://github.com/<owner>/<name>, got {url!r}")
    return url, branch


def badge_line(notebook: Path, url: str, branch: str) -> str:
    """The markdown badge that opens `notebook` on Colab."""
    github_path = url.removeprefix("https://github.com/")
    link = f"{COLAB}/github/{github_path}/blob/{branch}/{notebook.relative_to(ROOT).as_posix()}"
    image = "data:image/png;base64," + base64.b64encode(BADGE_PNG.read_bytes()).decode()
    return f"[![{BADGE_ALT}]({image})]({link})"


def setup_source(url: str, branch: str, pair: str | None = None) -> str:
    """The set-up cell, the same in every chapter but for its PAIR (every line within
    80 characters): None lets `open_pair` choose, a name fixes the pair (`FIXED_PAIR`).

    On Colab it runs a plain `pip install` of the repository: no `--upgrade`, so pip
    keeps every dependency Colab already ships when that release satisfies the
    package's floor (torch, transformers, tokenizers...) and installs only what is
    missing or too old. pip's output is captured and shown only if pip fails, followed
    by an error that names what could not be installed (so no `-q`: all of it).
    """
    return f'''\
# Set-up. On Google Colab this installs the book's package, keeping the
# libraries Colab already has when they are recent enough; elsewhere it
# installs nothing. The pair: gpt2 -> gpt2-xl on a Colab GPU (the first run
# downloads 6.2 GB; a T4 runs it in float16, an A100 or L4 in bfloat16),
# otherwise the tiny pair shipped with the package. To choose, set PAIR to a
# pair name ("tiny", "gpt2") or the environment variable SPECDEC_PAIR.
# PACKAGE names the repository the book was built from. Hosted elsewhere:
# set repository.url and repository.branch in _config.yml, then run
# `python scripts/colab_cells.py --write`, which rewrites this cell and the
# Colab badge of every chapter (or edit PACKAGE here, for this copy only).
import subprocess
import sys

if "google.colab" in sys.modules:
    PACKAGE = "git+{url}@{branch}"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", PACKAGE],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        print(pip.stdout, pip.stderr, sep="\\n")
        raise RuntimeError(f"pip failed to install {{PACKAGE}} (output above)")

from specdec_ref.notebook import open_pair

PAIR = {pair}
pair = open_pair(PAIR)
print(pair.describe())'''


NOTE_TAG = "colab-note"
PASSES = ROOT / "book" / "data" / "colab-passes.json"
SWEEP = ROOT / "specdec_ref" / "data" / "size-sweep-cuda.json"
# The sweep's points with GPT-2 XL's and GPT-2's shapes (layers x width).
XL, GPT2 = "48 x 1600", "12 x 768"
# What a chapter loads on Colab beyond the article's pair, by its number.
EXTRA = {
    "09": " It also downloads Pythia-160m (about 0.3 GB), a draft with another tokenizer.",
    "10": " Its draft heads are trained for the tiny target only (heads for gpt2-xl cannot"
          " be trained on the book's machine).",
}
# Chapters whose set-up cell fixes the pair (a repr for the PAIR line), by number.
FIXED_PAIR = {"10": '"tiny"  # the heads are trained for the tiny target only'}


def note_source(notebook: Path) -> str:
    """The "On Colab" note of one chapter, its predicted T4 time computed from its passes."""
    if notebook.stem[:2] in FIXED_PAIR:
        return textwrap.fill(
            "**On Colab.** This chapter runs the tiny pair shipped with the package on any machine,"
            " GPU or not, and downloads nothing beyond the package." + EXTRA.get(notebook.stem[:2], "")
            + " Its models are small enough that a GPU gains little over a CPU: expect about the"
            " time the introduction's table gives for the book's CPU (a guess, not measured).", 88)
    passes = json.loads(PASSES.read_text()).get(notebook.stem)
    points = {p["name"]: p for p in json.loads(SWEEP.read_text())["points"]}
    target_ms = 1000 * points[XL]["target_step_s"]
    draft_ms = 1000 * points[GPT2]["target_step_s"]
    text = ("**On Colab.** With a GPU this chapter loads gpt2 -> gpt2-xl (float16 on a T4,"
            " bfloat16 on an A100 or L4). Every chapter opens a fresh runtime and downloads"
            " the pair again, about 6.2 GB." + EXTRA.get(notebook.stem[:2], ""))
    if passes is None:
        return textwrap.fill(text + " Its time on a T4 is not estimated yet.", 88)
    minutes = (passes["target"] * target_ms + passes["draft"] * draft_ms) / 60_000
    if minutes < 1:
        estimate = "under a minute"
    elif round(minutes) == 1:
        estimate = "about a minute"
    else:
        estimate = f"about {minutes:.0f} minutes"
    return textwrap.fill(
        text + f" After that, a T4 should take {estimate}: a prediction, from the chapter's"
        f" passes (at least {passes['target']:,} target and {passes['draft']:,} draft ones,"
        " counted on the CPU in `book/data/colab-passes.json`) at the H200 sweep's step"
        f" times, {target_ms:.1f} ms and {draft_ms:.1f} ms, which host overhead sets.", 88)


# What Colab reads from a notebook's metadata to choose the runtime it opens.
COLAB_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}


def expected_metadata(metadata: dict) -> dict:
    """`metadata` with the keys that make Colab open the notebook on a GPU runtime."""
    metadata = json.loads(json.dumps(metadata))  # a deep copy
    metadata["accelerator"] = COLAB_METADATA["accelerator"]
    metadata["colab"] = {**metadata.get("colab", {}), **COLAB_METADATA["colab"]}
    return metadata


def expected_cells(notebook: Path, cells: list[dict], url: str, branch: str) -> list[dict]:
    """`cells` with the badge line and the set-up cell as they should be."""
    cells = json.loads(json.dumps(cells))  # a deep copy
    if not cells or cells[0]["cell_type"] != "markdown":
        raise ValueError(f"{notebook.name}: the first cell must be the markdown title cell")
    title = "".join(cells[0]["source"]).splitlines()
    kept = [line for line in title if not line.startswith(f"[![{BADGE_ALT}]")]
    # The badge goes right under the title line, separated by blank lines.
    body = kept[1:]
    while body and not body[0].strip():
        body.pop(0)
    lines = [kept[0], "", badge_line(notebook, url, branch)] + ([""] + body if body else [])
    cells[0]["source"] = _as_source("\n".join(lines))
    setup = [c for c in cells if c["cell_type"] == "code" and SETUP_TAG in c.get("metadata", {}).get("tags", [])]
    first_code = next((c for c in cells if c["cell_type"] == "code"), None)
    if len(setup) != 1 or setup[0] is not first_code:
        raise ValueError(f"{notebook.name}: the first code cell, and only it, must carry the tag {SETUP_TAG!r}")
    fixed = FIXED_PAIR.get(notebook.stem[:2], "None")
    setup[0]["source"] = _as_source(setup_source(url, branch, fixed))
    # The "On Colab" note: the markdown cell right after the set-up cell.
    at = cells.index(setup[0]) + 1
    note = {"cell_type": "markdown", "id": NOTE_TAG, "metadata": {"tags": [NOTE_TAG]}, "source": []}
    if at < len(cells) and NOTE_TAG in cells[at].get("metadata", {}).get("tags", []):
        note = cells[at]
    else:
        cells.insert(at, note)
    note["source"] = _as_source(note_source(notebook))
    return cells


def _as_source(text: str) -> list[str]:
    """Notebook-style source: a list of lines that keep their newlines."""
    return text.splitlines(keepends=True)


def _normalise(source: str | list[str]) -> str:
    return "".join(source) if isinstance(source, list) else source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report notebooks that differ; exit 1 if any")
    mode.add_argument("--write", action="store_true", help="rewrite the badge and the set-up cell")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    args = parser.parse_args(argv)

    url, branch = repository()
    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    stale = []
    for path in paths:
        notebook = json.loads(path.read_text())
        expected = expected_cells(path, notebook["cells"], url, branch)
        metadata = expected_metadata(notebook["metadata"])
        pairs = zip(notebook["cells"], expected, strict=False)
        same = len(notebook["cells"]) == len(expected) and all(
            _normalise(a["source"]) == _normalise(b["source"]) for a, b in pairs)
        if same and metadata == notebook["metadata"]:
            continue
        stale.append(path.relative_to(ROOT).as_posix())
        if args.write:
            notebook["cells"] = expected
            notebook["metadata"] = metadata
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    if args.check and stale:
        print("badge, set-up cell or Colab metadata out of step with _config.yml (run scripts/colab_cells.py --write):",
              *stale, sep="\n  ")
        return 1
    print(f"colab cells: {len(paths)} notebooks, {len(stale)} {'rewritten' if args.write else 'differ'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

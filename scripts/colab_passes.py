"""Count the model passes each chapter makes, the basis of its "On Colab" time estimate.

A chapter's time on a Colab GPU is mostly its passes through the two models. This script
runs each notebook top to bottom with the tiny pair, as CI does, and counts every call of
the target's and the draft's LM head (a linear map from the hidden size to the
vocabulary, called once per pass whatever the pass computes); the run with gpt2 -> gpt2-xl
makes the same passes, because a chapter's loops do not depend on the pair. A pass that
bypasses `torch.nn.functional.linear` (a prepacked kernel) is not counted, so the counts
are lower bounds. The result goes to book/data/colab-passes.json, which
scripts/colab_cells.py turns into each chapter's "On Colab" note.

    python scripts/colab_passes.py [notebooks/NN-name.ipynb ...]   # default: every chapter
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "data" / "colab-passes.json"

# The tiny pair's LM heads, (vocabulary, hidden size): the target's and the draft's.
HEADS = {"target": (4096, 384), "draft": (4096, 256)}

COUNTER = f"""
import json as _json, torch as _torch
_SPECDEC_HEADS = {{tuple(v): k for k, v in {json.dumps(HEADS)}.items()}}
_SPECDEC_PASSES = {{"target": 0, "draft": 0}}
_specdec_linear = _torch.nn.functional.linear
def _specdec_counting_linear(input, weight, bias=None):
    role = _SPECDEC_HEADS.get(tuple(weight.shape))
    if role is not None:
        _SPECDEC_PASSES[role] += 1
    return _specdec_linear(input, weight, bias)
_torch.nn.functional.linear = _specdec_counting_linear
"""
REPORT = "print('SPECDEC_PASSES', _json.dumps(_SPECDEC_PASSES))"


def count(path: Path) -> dict[str, int]:
    """{"target": passes, "draft": passes} of one notebook's run."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(COUNTER))
    notebook.cells.append(nbformat.v4.new_code_cell(REPORT))
    NotebookClient(notebook, timeout=1800, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for output in notebook.cells[-1].outputs:
        text = output.get("text", "")
        if text.startswith("SPECDEC_PASSES"):
            return json.loads(text.split(" ", 1)[1])
    raise RuntimeError(f"{path.name}: the counting cell printed nothing")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    os.environ.update(SPECDEC_THREADS="1", SPECDEC_DTYPE="float32", OMP_NUM_THREADS="1")
    os.environ.pop("SPECDEC_PAIR", None)
    paths = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    counts = json.loads(OUT.read_text()) if OUT.is_file() else {}
    for path in paths:
        counts[path.stem] = count(path)
        print(path.stem, counts[path.stem], flush=True)
    counts = {stem: counts[stem] for stem in sorted(counts) if (ROOT / "notebooks" / f"{stem}.ipynb").is_file()}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(counts, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

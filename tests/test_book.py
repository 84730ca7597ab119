"""The book's scaffolding: the pair picker, the notebooks' shape, and their Colab cells."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from specdec_ref.notebook import CPU_PAIR, GPU_PAIR, PAIR_ENV, choose_pair

ROOT = Path(__file__).resolve().parent.parent
# Chapter notebook -> the module it teaches (the README's chapter table says the same).
CHAPTER_MODULES = {
    "01-memory-bound-decoding": "specdec_ref.memory",
    "02-drafting": "specdec_ref.drafting",
    "03-one-pass-verification": "specdec_ref.verification",
}


def _load_script(name: str):
    """Import scripts/<name>.py (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return files


def _code(notebook: str) -> str:
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_choose_pair_prefers_override_then_environment_then_hardware():
    """An explicit name wins, then $SPECDEC_PAIR, then gpt2 on a Colab GPU, else tiny."""
    assert choose_pair("gpt2", colab=False, cuda=False, environ={PAIR_ENV: "tiny"}) == "gpt2"
    assert choose_pair(None, colab=True, cuda=True, environ={PAIR_ENV: "tiny"}) == "tiny"
    assert choose_pair(None, colab=True, cuda=True, environ={}) == GPU_PAIR == "gpt2"
    assert choose_pair(None, colab=True, cuda=False, environ={}) == CPU_PAIR == "tiny"
    assert choose_pair(None, colab=False, cuda=True, environ={}) == "tiny"


@pytest.mark.parametrize("override, environ", [("", {}), ("  ", {}), (None, {PAIR_ENV: ""})])
def test_choose_pair_rejects_empty_names(override, environ):
    """An empty override or an empty SPECDEC_PAIR is an error that names its source."""
    with pytest.raises(ValueError, match="override|SPECDEC_PAIR"):
        choose_pair(override, colab=False, cuda=False, environ=environ)


def test_toc_lists_every_chapter_and_page():
    """Every page in _toc.yml exists, and every chapter notebook is in _toc.yml."""
    files = _toc_files()
    for name in files:
        assert any((ROOT / f"{name}{suffix}").is_file() for suffix in (".md", ".ipynb")), name
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        assert f"notebooks/{notebook.stem}" in files, f"{notebook.name} is not in _toc.yml"


@pytest.mark.parametrize("notebook, module", sorted(CHAPTER_MODULES.items()))
def test_chapter_imports_its_module(notebook, module):
    """Chapter N imports the module it teaches."""
    imported = set()
    for node in ast.walk(ast.parse(_code(notebook).replace("%", "#"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    assert module in imported


def test_notebooks_follow_the_skeleton():
    """Each chapter has the skeleton's sections and commits its outputs."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for heading in ("## What you'll learn", "## What you need", "## Summary", "## Exercises", "## References"):
            assert heading in text, f"{path.name} lacks {heading!r}"
        code = [c for c in cells if c["cell_type"] == "code"]
        assert all(c.get("outputs") is not None for c in code)
        assert sum(bool(c.get("outputs")) for c in code) >= len(code) // 2, f"{path.name} has no committed outputs"


def test_colab_badge_and_setup_cell_match_config():
    """Every notebook's badge and set-up cell use the repository and branch of _config.yml."""
    colab_cells = _load_script("colab_cells")
    url, branch = colab_cells.repository()
    assert colab_cells.main(["--check"]) == 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        assert colab_cells.badge_line(path, url, branch) in "".join(cells[0]["source"])
        assert f"git+{url}@{branch}" in _code(path.stem)


def test_offline_assets_are_used_only_when_complete(tmp_path):
    """The book serves MathJax and the widget manager locally only once all of them are there."""
    spec = importlib.util.spec_from_file_location("offline_assets", ROOT / "book" / "_ext" / "offline_assets.py")
    offline_assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(offline_assets)
    folder = tmp_path / offline_assets.STATIC_DIR
    files = [offline_assets.MATHJAX, offline_assets.REQUIREJS, offline_assets.WIDGETS]
    assert not offline_assets.offline_assets_present(tmp_path)
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("// asset")
    assert not offline_assets.offline_assets_present(tmp_path)  # no manifest yet: a copy in progress
    (folder / "manifest.json").write_text(json.dumps({"files": files}))
    assert offline_assets.offline_assets_present(tmp_path)
    (folder / offline_assets.WIDGETS).unlink()
    assert not offline_assets.offline_assets_present(tmp_path)

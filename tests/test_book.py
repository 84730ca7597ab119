"""The book's scaffolding: the pair picker, the notebooks' shape, and their Colab cells."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from specdec_ref.notebook import CPU_PAIR, GPU_PAIR, PAIR_ENV, choose_pair

ROOT = Path(__file__).resolve().parent.parent
# Chapter notebook -> the modules it teaches, space-separated (the README's chapter table says the same).
CHAPTER_MODULES = {
    "01-memory-bound-decoding": "specdec_ref.memory",
    "02-drafting": "specdec_ref.drafting",
    "03-one-pass-verification": "specdec_ref.verification",
    "04-rejection-sampling-proof": "specdec_ref.rejection",
    "05-bonus-token-and-kv-cache": "specdec_ref.kv_cache",
    "06-performance": "specdec_ref.analysis",
    "12-measuring-speed-fairly": "specdec_ref.fast.packed specdec_ref.fast.batch_invariant specdec_ref.fast.lean "
                                       "specdec_ref.fast",
    "07-beyond-one-sequence": "specdec_ref.batched specdec_ref.lookup",
    "08-trees-of-drafts": "specdec_ref.trees.tree specdec_ref.trees.verify specdec_ref.trees.model",
    "09-drafts-with-another-tokenizer": "specdec_ref.cross_vocab.tokenizers specdec_ref.cross_vocab.drafting "
                                        "specdec_ref.cross_vocab.law",
    "10-draft-heads": "specdec_ref.heads.eagle specdec_ref.heads.medusa specdec_ref.heads.drafters "
                      "specdec_ref.heads.trees specdec_ref.heads.typical",
    "11-auditing-a-sampler": "specdec_ref.audit specdec_ref.audit_tokens",
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
        for chapter in part["chapters"]:
            files += [chapter["file"]] + [section["file"] for section in chapter.get("sections", [])]
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


def test_pair_choice_says_why_in_a_line_that_fits_the_page():
    """Each way a pair is chosen comes with its reason: the GPU found or not, the override, the variable."""
    from specdec_ref.notebook import pair_choice

    cases = [("gpt2", {}, False, False, "gpt2", "PAIR"), (None, {PAIR_ENV: "tiny"}, True, True, "tiny", PAIR_ENV),
             (None, {}, True, True, "gpt2", "GPU was found"), (None, {}, True, False, "tiny", "no GPU"),
             (None, {}, False, True, "tiny", "not Colab"), (None, {}, False, False, "tiny", "no GPU")]
    reasons = set()
    for override, environ, colab, cuda, name, phrase in cases:
        chosen, reason = pair_choice(override, colab=colab, cuda=cuda, environ=environ)
        assert chosen == name and phrase in reason and len(f"why: {reason}") <= 80
        reasons.add(reason)
    assert len(reasons) == len(cases)


def _case_pickers(source: str) -> list[str]:
    """The constructs in `source` that assume a case occurs: `next(<generator>)` without a default, and
    `min`/`max` over a filtered generator without `default=`; each raises when nothing matches."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "next" and len(node.args) == 1 and not node.keywords:
            found.append(ast.unparse(node))
        elif (node.func.id in ("min", "max") and len(node.args) == 1
              and isinstance(node.args[0], ast.GeneratorExp | ast.ListComp)
              and any(g.ifs for g in node.args[0].generators)
              and not any(k.arg == "default" for k in node.keywords)):
            found.append(ast.unparse(node))
    return found


def test_case_pickers_are_found():
    """The scan sees each construct that raises on an empty match, and passes those with a default."""
    assert len(_case_pickers("a = next(i for i in x if i)\nb = max(i for i in x if i > 0)\n"
                             "c = min([i for i in x if i])")) == 3
    assert _case_pickers("a = next((i for i in x if i), None)\nb = max((i for i in x if i), default=0)\n"
                         "c = max(i for i in x)\nd = next(iter(x), None)") == []


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_no_chapter_assumes_that_a_case_occurs(path):
    """A chapter runs on any pair: a "first iteration where X" may not exist there (the article's pair,
    a stand-in), so every search over the run has a default and the cell says what happened instead."""
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)
        assert _case_pickers(source) == [], f"{path.name}, cell {i}: give these a default"


def test_notebooks_ask_colab_for_a_gpu():
    """"Open in Colab" starts a GPU runtime (a T4), where the chapters load the article's pair."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        metadata = json.loads(path.read_text())["metadata"]
        assert metadata.get("accelerator") == "GPU", path.name
        assert metadata.get("colab", {}).get("gpuType") == "T4", path.name


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
    assert set(module.split()) <= imported


def test_notebooks_follow_the_skeleton():
    """Each chapter has the skeleton's sections and commits its outputs."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        headings = ("{rubric} What you'll learn", "{rubric} What you need", "## Summary", "## Exercises",
                    "## References")
        for heading in headings:
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


def test_install_line_badges_readme_and_config_name_one_repository():
    """Read independently of scripts/colab_cells.py: every chapter's install line (PACKAGE), its Colab
    badge, the README's chapter links and _config.yml name the same GitHub repository and branch, and the
    set-up cell says what to change when the book is hosted elsewhere."""
    import re

    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    owner_name = config["url"].rstrip("/").removeprefix("https://github.com/")
    branch = config["branch"]
    colab = re.compile(r"colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/([^/]+)/notebooks/([\w-]+)\.ipynb")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        setup = "".join(cells[1]["source"]) if cells[1]["cell_type"] == "code" else _code(path.stem)
        assert re.findall(r'PACKAGE = "git\+https://github\.com/([^@"]+)@([^"]+)"', setup) == [(owner_name, branch)]
        assert "repository.url" in setup and "scripts/colab_cells.py --write" in setup
        badges = colab.findall("".join(cells[0]["source"]))
        assert badges == [(owner_name, branch, path.stem)], path.name
    readme = colab.findall((ROOT / "README.md").read_text())
    assert {stem for _, _, stem in readme} >= {p.stem for p in (ROOT / "notebooks").glob("0[1-7]-*.ipynb")}
    assert all((name, ref) == (owner_name, branch) for name, ref, _ in readme), readme


def _run_setup_cell(monkeypatch, returncode: int) -> tuple[list[list[str]], dict]:
    """Run the set-up cell as on Colab, with pip replaced by a stub; return pip's calls and the cell's names."""
    colab_cells = _load_script("colab_cells")
    calls = []

    def fake_run(args, **kwargs):
        calls.append(list(args))
        assert kwargs.get("capture_output") and kwargs.get("text"), "pip's output must be captured as text"
        return subprocess.CompletedProcess(args, returncode, stdout="Collecting specdec_ref\n",
                                           stderr="ERROR: no matching distribution\n" if returncode else "")

    class FakePair:
        def describe(self) -> str:
            return "pair: stub"

    import specdec_ref.notebook

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(specdec_ref.notebook, "open_pair", lambda name: FakePair())
    names: dict = {}
    exec(compile(colab_cells.setup_source(*colab_cells.repository()), "setup-cell", "exec"), names)
    return calls, names


def test_colab_setup_cell_fits_the_page_and_never_upgrades():
    """Every line <= 80 characters; one plain `pip install` of the repository (no --upgrade)."""
    colab_cells = _load_script("colab_cells")
    url, branch = colab_cells.repository()
    source = colab_cells.setup_source(url, branch)
    assert max(len(line) for line in source.splitlines()) <= 80
    assert "--upgrade" not in source and "-U" not in source.split() and "--force" not in source
    assert f'"git+{url}@{branch}"' in source


def test_colab_setup_cell_installs_quietly_when_pip_succeeds(monkeypatch, capsys):
    """On Colab, a successful pip prints nothing of its own; the cell goes on to open the pair."""
    calls, names = _run_setup_cell(monkeypatch, returncode=0)
    assert len(calls) == 1 and calls[0][1:4] == ["-m", "pip", "install"]
    assert not any(arg.startswith("-U") or arg.startswith("--upgrade") for arg in calls[0])
    assert calls[0][-1].startswith("git+https://github.com/")
    assert capsys.readouterr().out == "pair: stub\n"
    assert names["PAIR"] is None


def test_colab_setup_cell_shows_pip_output_when_pip_fails(monkeypatch, capsys):
    """A failed pip shows its output and raises an error naming the package, not a bare CalledProcessError."""
    with pytest.raises(RuntimeError, match="pip failed to install git\\+https://github.com/"):
        _run_setup_cell(monkeypatch, returncode=1)
    out = capsys.readouterr().out
    assert "ERROR: no matching distribution" in out and "Collecting specdec_ref" in out


def test_colab_setup_cell_does_nothing_outside_colab(monkeypatch):
    """Without google.colab the set-up cell never calls pip."""
    colab_cells = _load_script("colab_cells")
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was called outside Colab"))
    import specdec_ref.notebook

    monkeypatch.setattr(specdec_ref.notebook, "open_pair", lambda name: types.SimpleNamespace(describe=lambda: "ok"))
    namespace: dict = {}
    exec(compile(colab_cells.setup_source(*colab_cells.repository()), "setup-cell", "exec"), namespace)
    assert namespace["pair"].describe() == "ok"  # it went on to open the pair, without pip


def test_offline_assets_are_used_only_when_complete(tmp_path):
    """The book serves MathJax and the widget manager locally only once all of them are there."""
    pytest.importorskip("sphinx")  # the book extensions import it (the [book] extra)
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


def test_opening_page_comes_before_chapter_one():
    """The at-a-glance page is in _toc.yml before chapter 1 and prints its trace with specdec_ref.trace."""
    files = _toc_files()
    assert files.index("notebooks/00-at-a-glance") < files.index("notebooks/01-memory-bound-decoding")
    code = _code("00-at-a-glance")
    assert "trace.marked_text(" in code and "time_call(" in code and "autoregressive_generate(" in code


def test_widget_modules_find_their_fonts_in_the_manager_folder():
    """Every AMD module the widget bundle defines is mapped to _static/html-manager/, where its fonts are."""
    pytest.importorskip("sphinx")  # the book extensions import it (the [book] extra)
    spec = importlib.util.spec_from_file_location("offline_assets", ROOT / "book" / "_ext" / "offline_assets.py")
    offline_assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(offline_assets)
    script = offline_assets.REQUIRE_CONFIG_JS
    assert '"_static/html-manager/embed-amd"' in script and "window.require = {paths: paths}" in script
    bundle = ROOT / offline_assets.STATIC_DIR / offline_assets.WIDGETS
    if not bundle.is_file():
        pytest.skip("no widget bundle (run `make static`)")
    defined = set(re.findall(r'define\("@jupyter-widgets/([^"]+)"', bundle.read_text()))
    assert defined and defined <= set(offline_assets.WIDGET_MODULES), defined - set(offline_assets.WIDGET_MODULES)
    fonts = [p for p in bundle.parent.iterdir() if p.suffix in {".woff", ".woff2", ".ttf"}]
    assert fonts, "the manager's fonts are not next to it"


def test_parting_finds_where_greedy_outputs_differ_and_how_near_a_tie():
    """None when equal; else the first differing index and the target's probability gap there."""
    from specdec_ref.notebook import open_pair

    pair = open_pair("tiny")
    ids = pair.encode("import os\n")[0].tolist()
    assert pair.parting(ids, list(ids)) is None
    p = pair.target_model(torch.tensor([ids])).logits[0, -1].float().softmax(-1)
    best, other = p.topk(2).indices.tolist()
    i, gap = pair.parting(ids + [best], ids + [other])
    assert i == len(ids) and gap == pytest.approx((p[best] - p[other]).item(), abs=1e-6)
    assert pair.parting(ids, ids + [best]) == (len(ids), float("inf"))  # one is a prefix of the other

"""What a reader sees: the notebooks' page rules, the opening page's trace, the browser check.

The page rules are read from each notebook's JSON, so they fail before a build does:
lines that fit the page, figures with a caption and alt text, solutions labelled with
their exercise. Each rule is also run on a small broken notebook, to show it can fail.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from specdec_ref import SamplingConfig, speculative_generate, trace
from specdec_ref.decoder import GenerationStats, IterationRecord
from specdec_ref.trace import LEGEND, NEWLINE_MARK, STEP_LEGEND, iteration_lines, marked_text, split_record, stats_lines

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDTH = 80  # characters a page shows without scrolling
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HIDDEN = {"hide-cell", "hide-input"}


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


# --- the rules ------------------------------------------------------------------------


def long_lines(notebook: dict, width: int = WIDTH) -> list[str]:
    """Code lines and text-output lines (stream, text/plain) longer than `width`."""
    found = []
    for number, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        for line in _source(cell).splitlines():
            if len(line) > width:
                found.append(f"cell {number}: code line of {len(line)} characters: {line[:50]!r}")
        for output in cell.get("outputs", []):
            if output["output_type"] == "stream":
                text = _text(output.get("text", ""))
            elif output["output_type"] in ("execute_result", "display_data"):
                text = _text(output.get("data", {}).get("text/plain", ""))
            else:
                continue
            for line in text.splitlines():
                if len(line) > width:
                    found.append(f"cell {number}: output line of {len(line)} characters: {line[:50]!r}")
    return found


def _widget_images(notebook: dict, model_id: str) -> bool:
    """Whether the saved widget `model_id`, or any widget inside it, shows a PNG."""
    state = notebook.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models, seen, todo = state.get("state", {}), set(), [model_id]
    while todo:
        current = todo.pop()
        if current in seen or current not in models:
            continue
        seen.add(current)
        model = models[current].get("state", {})
        if any("image/png" in output.get("data", {}) for output in model.get("outputs", [])):
            return True
        # Children and other references are strings "IPY_MODEL_<id>", alone or in lists.
        todo += re.findall(r"IPY_MODEL_(\w+)", json.dumps(model))
    return False


def uncaptioned_figures(notebook: dict) -> list[str]:
    """Cells that draw a PNG (directly or in a widget) without a caption, a name and alt text."""
    found = []
    for number, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        outputs = cell.get("outputs", [])
        draws = any("image/png" in output.get("data", {}) for output in outputs) or any(
            _widget_images(notebook, output["data"][WIDGET_VIEW].get("model_id", ""))
            for output in outputs if WIDGET_VIEW in output.get("data", {}))
        if not draws:
            continue
        meta = cell.get("metadata", {}).get("mystnb", {})
        figure, image = meta.get("figure", {}), meta.get("image", {})
        if not str(figure.get("caption", "")).strip():
            found.append(f"cell {number}: a figure without mystnb.figure.caption")
        if not str(figure.get("name", "")).startswith("fig-"):
            found.append(f"cell {number}: a figure without a mystnb.figure.name 'fig-...'")
        alt = str(image.get("alt", "")).strip()
        if not alt or re.search(r"\.(png|jpe?g|svg)$", alt):
            found.append(f"cell {number}: a figure without mystnb.image.alt text")
    return found


def unlabelled_solutions(notebook: dict, chapter: int) -> list[str]:
    """Solutions not labelled "Solution to exercise N.M" for an exercise N.M stated before them.

    Solutions are hidden code cells (tags hide-cell or hide-input) in the Exercises
    section or whose code says "solution", and `{dropdown}` blocks in that section or
    whose title says "solution".
    """
    found, stated, in_exercises = [], set(), False
    for number, cell in enumerate(notebook["cells"]):
        text = _source(cell)
        if cell["cell_type"] == "markdown":
            for line in text.splitlines():
                heading = re.match(r"#+\s+(.*)", line)
                if heading:
                    in_exercises = heading.group(1).strip().lower() == "exercises"
                stated |= set(re.findall(rf"\*\*Exercise {chapter}\.(\d+)\.?\*\*", line))
                dropdown = re.match(r"\s*(?::{3,}|`{3,})\{dropdown\}\s*(.*)", line)
                if dropdown and (in_exercises or "solution" in dropdown.group(1).lower()):
                    title = dropdown.group(1).strip()
                    label = re.fullmatch(rf"Solution to exercise {chapter}\.(\d+)", title)
                    if not label or label.group(1) not in stated:
                        found.append(f"cell {number}: dropdown {title!r} is not 'Solution to exercise "
                                     f"{chapter}.M' for a stated exercise (stated: {sorted(stated, key=int)})")
        elif cell["cell_type"] == "code":
            tags = set(cell.get("metadata", {}).get("tags", []))
            if not tags & HIDDEN or not (in_exercises or "solution" in text.lower()):
                continue
            meta = cell.get("metadata", {}).get("mystnb", {})
            show, hide = meta.get("code_prompt_show", ""), meta.get("code_prompt_hide", "")
            label = re.fullmatch(rf"Show the solution to exercise {chapter}\.(\d+)", show)
            if not label or label.group(1) not in stated:
                found.append(f"cell {number}: hidden solution with code_prompt_show {show!r}, not 'Show the "
                             f"solution to exercise {chapter}.M' for a stated exercise")
            elif hide != f"Hide the solution to exercise {chapter}.{label.group(1)}":
                found.append(f"cell {number}: code_prompt_hide {hide!r} does not name exercise "
                             f"{chapter}.{label.group(1)}")
    return found


def _chapter(path: Path) -> int:
    """The chapter a notebook belongs to: 6 for 06-performance, 12 for 12-measuring-speed-fairly"""
    return int(re.match(r"\d+", path.stem).group())


# --- the rules on every notebook -------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_code_and_output_lines_fit_the_page(path):
    """No code line and no printed line of a notebook is wider than 80 characters."""
    problems = long_lines(json.loads(path.read_text()))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_figure_has_a_caption_and_alt_text(path):
    """Every cell that draws a PNG names its figure, captions it and describes it in alt text."""
    problems = uncaptioned_figures(json.loads(path.read_text()))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_solution_names_its_exercise(path):
    """Hidden solution cells and solution dropdowns say which exercise N.M they solve."""
    problems = unlabelled_solutions(json.loads(path.read_text()), _chapter(path))
    assert not problems, "\n".join(problems)


# --- the rules can fail ----------------------------------------------------------------


def _cell(kind: str, source: str, **extra) -> dict:
    cell = {"cell_type": kind, "metadata": extra.pop("metadata", {}), "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell["outputs"] = extra.pop("outputs", [])
    return cell


def _png_output() -> dict:
    return {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"},
            "metadata": {}}


def test_page_rules_catch_a_broken_notebook():
    """Each rule finds its defect in a small notebook that breaks it, and passes the fixed one."""
    long = "x = " + "1 + " * 25 + "1"  # 104 characters
    broken = {"metadata": {}, "cells": [
        _cell("code", long, outputs=[{"output_type": "stream", "name": "stdout", "text": "y" * 81 + "\n"}]),
        _cell("code", "plt.plot(x)", outputs=[_png_output()]),
        _cell("markdown", "## Exercises\n\n**Exercise 2.1.** Try it.\n\n:::{dropdown} Solution 1\nDone.\n:::"),
        _cell("code", "print(42)",
              metadata={"tags": ["hide-cell"], "mystnb": {"code_prompt_show": "Show the solution"}}),
        _cell("code", "print(43)", metadata={"tags": ["hide-input"], "mystnb": {
            "code_prompt_show": "Show the solution to exercise 2.9",
            "code_prompt_hide": "Hide the solution to exercise 2.9"}}),
    ]}
    assert [p.split(":")[1].strip().split(" of ")[0] for p in long_lines(broken)] == ["code line", "output line"]
    assert len(uncaptioned_figures(broken)) == 3  # caption, name, alt
    assert len(unlabelled_solutions(broken, 2)) == 3  # the dropdown, an unnamed and a wrong exercise

    fixed = json.loads(json.dumps(broken))
    fixed["cells"][0]["source"] = ["x = 1\n"]
    fixed["cells"][0]["outputs"][0]["text"] = "y" * 80 + "\n"
    fixed["cells"][1]["metadata"]["mystnb"] = {"figure": {"caption": "A line.", "name": "fig-02-line"},
                                               "image": {"alt": "A straight line rising to the right."}}
    fixed["cells"][2]["source"] = [line.replace("Solution 1", "Solution to exercise 2.1")
                                   for line in fixed["cells"][2]["source"]]
    for cell in fixed["cells"][3:]:
        cell["metadata"]["mystnb"] = {"code_prompt_show": "Show the solution to exercise 2.1",
                                      "code_prompt_hide": "Hide the solution to exercise 2.1"}
    assert long_lines(fixed) == [] and uncaptioned_figures(fixed) == [] and unlabelled_solutions(fixed, 2) == []


def test_figure_rule_sees_images_inside_widgets():
    """A widget output whose saved state holds a PNG (in a nested Output widget) is a figure too."""
    state = {"box": {"state": {"children": ["IPY_MODEL_out"]}},
             "out": {"state": {"outputs": [_png_output()]}}}
    notebook = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": state}}},
                "cells": [_cell("code", "explorer", outputs=[
                    {"output_type": "display_data", "metadata": {},
                     "data": {WIDGET_VIEW: {"model_id": "box"}, "text/plain": "VBox()"}}])]}
    assert len(uncaptioned_figures(notebook)) == 3
    state["out"]["state"]["outputs"] = []
    assert uncaptioned_figures(notebook) == []


# --- the opening page's trace ----------------------------------------------------------


class CharTokenizer:
    """Token t is one character: t = 0 is a newline, others letters (no marker characters)."""

    def decode(self, tokens):
        return "".join("\n" if t == 0 else chr(ord("a") + (t - 1) % 26) for t in tokens)


RECORDS = [
    IterationRecord(drafted=[1, 2, 3, 4], emitted=[1, 2, 9], num_accepted=2),  # correction i
    IterationRecord(drafted=[5, 0, 6], emitted=[5, 0, 6, 7], num_accepted=3),  # bonus g
    IterationRecord(drafted=[0, 8], emitted=[3], num_accepted=0),  # rejected at once
    IterationRecord(drafted=[1, 2], emitted=[1], num_accepted=1),  # cut after an EOS
]


def test_marked_text_marks_each_token_and_keeps_the_text():
    """Markers show correction, bonus and discarded drafts; without them the text is the emitted one."""
    tokenizer = CharTokenizer()
    text = marked_text(RECORDS, tokenizer, width=1000)
    assert text == f"ab~cd~[i]e\nf{{g}}~{NEWLINE_MARK}\nh~[c]a"
    emitted = tokenizer.decode([t for record in RECORDS for t in record.emitted])
    plain = re.sub(r"~[^~]*~", "", text).replace(NEWLINE_MARK, "")
    assert re.sub(r"[\[\]{}]", "", plain) == emitted
    assert split_record(RECORDS[3]) == ([1], [], [], "correction")  # nothing added after the EOS


def test_a_step_without_drafts_is_a_plain_target_step_not_a_bonus():
    """An iteration whose drafter proposed nothing is marked and named a plain target step."""
    tokenizer = CharTokenizer()
    records = [IterationRecord(drafted=[], emitted=[2], num_accepted=0), *RECORDS[:1]]
    assert split_record(records[0]) == ([], [], [2], "target step")
    assert marked_text(records, tokenizer, width=1000) == "<b>ab~cd~[i]"
    lines = iteration_lines(records, tokenizer)
    assert lines[:2] == ["  1. drafted nothing", "     a plain target step: 'b'"]
    assert not any("bonus" in line for line in lines)
    assert trace.legend(RECORDS) == LEGEND and STEP_LEGEND in trace.legend(records).splitlines()
    assert trace.legend(records).splitlines()[-1] == LEGEND.splitlines()[-1]


def test_marked_text_folds_long_lines():
    """Every line of the marked text fits the width; a line is cut before a space where it can be."""
    records = [IterationRecord(drafted=[1] * 4, emitted=[1] * 5, num_accepted=4) for _ in range(30)]
    text = marked_text(records, None, width=40)
    assert max(len(line) for line in text.splitlines()) <= 40
    assert all(line.startswith(" ") for line in text.splitlines())  # each cut falls before a space
    with pytest.raises(ValueError, match="width"):
        marked_text(records, None, width=0)


def test_trace_of_a_real_run_is_consistent(tiny_pair):
    """On a real run: the marked text has one correction or bonus per iteration, and short lines."""
    draft, target = tiny_pair
    prompt = torch.tensor([[1, 2, 3, 4]])
    output = speculative_generate(target, draft, prompt, max_new_tokens=20, num_draft_tokens=3,
                                  sampling=SamplingConfig(temperature=0.0))
    text = marked_text(output.trace)
    assert text.count("[") + text.count("{") + text.count("<") == output.stats.iterations
    lines = iteration_lines(output.trace)
    assert len(lines) == 2 * output.stats.iterations and max(map(len, lines)) <= WIDTH
    assert max(map(len, LEGEND.splitlines())) <= WIDTH and len(STEP_LEGEND) <= WIDTH


def test_stats_name_alpha_and_the_acceptance_rate_apart():
    """The counters print alpha as accepted / judged and the acceptance rate as accepted / drafted."""
    stats = GenerationStats(new_tokens=10, iterations=3, drafted_tokens=12, accepted_tokens=6,
                            judged_tokens=8, target_calls=3, draft_calls=12)
    lines = stats_lines(stats)
    assert "alpha, estimated: 0.75 (accepted 6 / judged 8 drafts)" in lines
    assert "acceptance rate: 0.50 (accepted 6 / drafted 12 drafts)" in lines
    assert "block efficiency: 3.33 tokens per target pass" in lines
    assert max(map(len, lines)) <= WIDTH


@pytest.fixture
def tiny_pair():
    from conftest import make_model

    return make_model("gpt2", layers=1, width=32, seed=1), make_model("gpt2", layers=2, width=64, seed=0)


# --- the browser check -----------------------------------------------------------------


def _browser_check():
    spec = importlib.util.spec_from_file_location("browser_check", ROOT / "scripts" / "browser_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(**changes) -> dict:
    report = {"untypeset": [], "rawTex": [], "rawMarkdown": [], "math": 0, "mathjax": False, "broken": [],
              "colab": [], "unrenderedWidgets": 0, "widgets": 0, "exceptions": [], "refused": [],
              "noAlt": [], "uncaptioned": [], "scrolling": [], "failed": [], "clipped": [], "blurry": []}
    return {**report, **changes}


def test_browser_problems_list_each_failed_request_and_unlabelled_image():
    """Each failed local request, image without alt text and uncaptioned figure is its own problem."""
    check = _browser_check()
    assert check.problems("page.html", False, _report(), offline=True) == []
    found = check.problems("page.html", False, _report(
        failed=["HTTP 404 http://127.0.0.1:1/a.woff", "net::ERR_FAILED http://127.0.0.1:1/b.css"],
        noAlt=["../_images/x.png (alt \"../_images/x.png\")"], uncaptioned=["plot"],
        scrolling=['96 characters: "x = 1"'], clipped=['table "Concept": scrolls sideways (900 > 700 px)'],
        blurry=["plot: 640 px drawn 600 px wide"]), offline=True)
    assert len(found) == 7
    assert any("clipped or scrolls sideways: table" in problem for problem in found)
    assert any("blurred at device pixel ratio 2" in problem for problem in found)
    assert sum("local request failed" in problem for problem in found) == 2


# A 1 x 1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg"
                       "==")


@pytest.mark.slow
@pytest.mark.skipif(_browser_check().find_browser() is None, reason="no Chromium on this machine")
def test_browser_check_fails_on_a_missing_file_and_an_unlabelled_figure(tmp_path, capsys):
    """A missing file, an uncaptioned image, a wide table or equation and a stretched image fail the page."""
    check = _browser_check()
    (tmp_path / "plot.png").write_bytes(PNG)
    good = ('<html><body><main><article><figure><img src="plot.png" alt="One dot."><figcaption>A dot.'
            '</figcaption></figure></article></main></body></html>')
    (tmp_path / "index.html").write_text(good)
    assert check.main(["--build", str(tmp_path)]) == 0
    bad = ('<html><head><link rel="stylesheet" href="missing.css"></head><body><main><article>'
           '<div class="cell_output"><img src="plot.png" alt="plot.png"></div>'
           f'<div class="cell"><div class="highlight"><pre>{"x" * 400}</pre></div></div>'
           f'<div style="overflow-x: auto"><table><tr><th>Wide</th><td style="white-space: nowrap">{"y " * 400}</td>'
           '</tr></table></div>'
           f'<div class="math"><span style="white-space: nowrap">{"z " * 400}</span></div>'
           '<figure><img src="plot.png" alt="One dot, stretched." style="width: 300px; height: 100px">'
           '<figcaption>Stretched.</figcaption></figure>'
           '</article></main></body></html>')
    (tmp_path / "index.html").write_text(bad)
    capsys.readouterr()
    assert check.main(["--build", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "local request failed: HTTP 404" in out and "missing.css" in out
    assert "image without alt text" in out and "figure without a caption" in out
    assert "scrolls sideways, a line of 400 characters" in out
    assert 'clipped or scrolls sideways: table "Wide"' in out and "clipped or scrolls sideways: display equation" in out
    assert "blurred at device pixel ratio 2" in out and "One dot, stretched.: 1 px drawn 300 px wide" in out


def test_widget_images_get_their_cells_alt_text():
    """book/_ext/widget_alt.py stores a cell's alt text beside its widget placeholder, and only there."""
    pytest.importorskip("docutils")  # the book extensions need it (the [book] extra)
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    spec = importlib.util.spec_from_file_location("widget_alt", ROOT / "book" / "_ext" / "widget_alt.py")
    widget_alt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(widget_alt)
    document = new_document("page", get_default_settings(Parser))
    view = f'<script type="{WIDGET_VIEW}">{{"model_id": "abc"}}</script>'
    for alt in ("Sliders above a plot </script>", None):
        metadata = {"mystnb": {"image": {"alt": alt}}} if alt else {}
        cell = nodes.container(nb_element="cell_code", cell_metadata=metadata)
        cell += nodes.figure("", nodes.raw("", view, format="html"))
        document += cell
    widget_alt.store_widget_alt(None, document)
    stored = [raw.astext() for raw in document.findall(nodes.raw) if "widget-image-alt" in raw.astext()]
    assert stored == ['<script type="application/json" class="widget-image-alt">'
                      '"Sliders above a plot <\\/script>"</script>']


def test_bibliography_labels_are_the_citations_author_year_labels(monkeypatch):
    """book/_ext/bib_labels.py labels entries "Chen et al., 2023", with a, b for equal labels."""
    pytest.importorskip("sphinxcontrib.bibtex")  # the [book] extra
    from pybtex.database import parse_string

    spec = importlib.util.spec_from_file_location("bib_labels", ROOT / "book" / "_ext" / "bib_labels.py")
    bib_labels = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bib_labels", bib_labels)  # its dataclass looks itself up there
    spec.loader.exec_module(bib_labels)
    bib = parse_string(r"""
        @article{a, author = {Chen, C. and Borgeaud, S. and Irving, G.}, year = {2023}, title = {A}}
        @article{b, author = {Li, Yuhui and Wei, Fangyun}, year = {2024}, title = {B}}
        @article{c, author = {Li, Yuhui and Wei, Fangyun}, year = {2024}, title = {C}}
        @misc{d, author = {{DeepSeek-AI}}, year = {2024}, title = {D}}
        @book{e, author = {van der Vaart, Aad W. and Wellner, Jon A.}, year = {1996}, title = {E}}
        @misc{f, author = {Kaiser, {\L}ukasz}, year = {2017}, title = {F}}""", "bibtex")
    labels = list(bib_labels.AuthorYearLabelStyle().format_labels(list(bib.entries.values())))
    assert labels == ["Chen et al., 2023", "Li and Wei, 2024a", "Li and Wei, 2024b", "DeepSeek-AI, 2024",
                      "van der Vaart and Wellner, 1996", "Kaiser, 2017"]

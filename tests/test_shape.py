"""The book's shape: its parts, its chapter numbers, and each page's length.

Issue 43 gives the book five parts by who reads what: the core (chapters 0-5), speed,
beyond one draft chain, engineers and evaluators, and the appendices. A core chapter
has at most 3,000 prose words, every other page at most 4,500, and a chapter at most
five learning goals; scripts/page_words.py counts them the same way for every page.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("The core: at a glance", "The core: building speculative decoding", "Speed",
         "Beyond one draft chain", "For engineers and evaluators", "Appendices")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


words = _script("page_words")
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
PAGES = words.toc_pages()


def test_the_parts_are_the_issues_in_order():
    """Five parts (the core in two, for chapter 0's unnumbered page), in reading order."""
    assert tuple(part["caption"] for part in TOC["parts"]) == PARTS


def test_the_core_is_chapters_0_to_5():
    core = [chapter["file"] for part in TOC["parts"][:2] for chapter in part["chapters"]]
    assert [Path(f).name[:2] for f in core] == ["00", "01", "02", "03", "04", "05"]


def test_no_page_is_a_section_of_another():
    """Every page is a chapter of its own: none is nested (as 06b once was, "6.14")."""
    for part in TOC["parts"]:
        for chapter in part["chapters"]:
            assert "sections" not in chapter, chapter["file"]


def test_a_notebooks_name_starts_with_its_chapter_number():
    """Chapter numbers run on across the numbered parts (myst's multitoc numbering), and
    exercises are numbered from the file name: the two must agree."""
    number = 0
    for part in TOC["parts"]:
        if not part.get("numbered"):
            continue
        for chapter in part["chapters"]:
            number += 1
            name = Path(chapter["file"]).name
            if chapter["file"].startswith("notebooks/"):
                assert int(re.match(r"\d+", name).group()) == number, (name, number)


def test_the_appendices_hold_claims_errata_and_notation():
    files = [chapter["file"] for chapter in TOC["parts"][-1]["chapters"]]
    assert files == ["book/claims", "book/errata", "book/notation"]


@pytest.mark.parametrize("part,path", PAGES, ids=[p.stem for _, p in PAGES])
def test_every_page_is_within_its_word_limit(part, path):
    count, cap = words.words(path), words.limit(part)
    assert count <= cap, f"{path.name}: {count} prose words, the limit is {cap}"


@pytest.mark.parametrize("part,path", PAGES, ids=[p.stem for _, p in PAGES])
def test_every_chapter_has_at_most_five_learning_goals(part, path):
    assert words.goals(path) <= words.GOAL_LIMIT, path.name


def test_every_page_is_in_the_intros_table():
    """The intro's table of chapters lists every page of the book, the appendices included."""
    intro = (ROOT / "book" / "intro.md").read_text()
    for _, path in PAGES[1:]:
        assert f"{{doc}}`../notebooks/{path.stem}`" in intro or f"{{doc}}`{path.stem}`" in intro, path.name


def test_the_counter_counts_prose_only(tmp_path):
    """Code, display math, option lines and comments are not prose; a glued value and
    inline math are words; goals are the bullets of "What you'll learn"."""
    text = ("# Title\n\n```{rubric} What you'll learn\n```\n\n- one;\n- two;\n\n"
            "Five words of prose {glue:text}`x:.2f` here $a + b$.\n\n"
            "```python\nlots of code that is not prose\n```\n\n$$\nx = y + z\n$$\n\n"
            ":::{dropdown} Solution to exercise 1.1\n:open:\nThree more words.\n:::\n"
            "<!-- a comment\nover lines -->\n")
    page = tmp_path / "page.md"
    page.write_text(text)
    # Title (1), What you'll learn (3), one; two; (2), the sentence (8: the glue is one,
    # "$a", "b$." two, "+" none), Solution to exercise 1.1 (4), Three more words. (3)
    assert words.words(page) == 21
    assert words.goals(page) == 2
    notebook = tmp_path / "page.ipynb"
    notebook.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": text.splitlines(True)},
        {"cell_type": "code", "source": ["print('not prose')\n"], "outputs": []}]}))
    assert words.words(notebook) == 21


def test_the_limits_can_fail(tmp_path):
    """A core chapter of 3,001 words or six goals is over its limits."""
    page = tmp_path / "long.md"
    page.write_text("## What you'll learn\n\n" + "- a goal\n" * 6 + "\n## Text\n\n" + "word " * 3001)
    assert words.words(page) > words.limit("The core: building speculative decoding")
    assert words.goals(page) > words.GOAL_LIMIT
    assert words.limit("Speed") == 4500

"""Prose words and learning goals per page of the book, counted the same way for every page.

A page is a notebook in notebooks/ or a Markdown page in book/. Its prose is the text of
its Markdown cells (a notebook) or of the file (a page), less what a reader does not read
as prose: fenced code, directives' option lines, display math, HTML comments, images,
tables' rule lines and MyST targets. Every remaining whitespace-separated token with a
letter or a digit counts as a word (inline math and glued values included; a directive's
title, such as "Solution to exercise 4.1", is read and counted). Learning goals are the bullets under the
heading or rubric "What you'll learn".

    python scripts/page_words.py          # a table of every page in the table of contents
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Limits of issue 43: a core chapter (0-5) at most 3,000 words and 5 learning goals,
# every other page at most 4,500 words.
CORE_LIMIT = 3000
OTHER_LIMIT = 4500
GOAL_LIMIT = 5

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}|:{3,})")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_IMAGE = re.compile(r"\[?!\[[^\]]*\]\([^)]*\)(\]\([^)]*\))?")


def page_text(path: Path) -> str:
    """The Markdown a reader reads on one page (a notebook's Markdown cells joined)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return path.read_text()


def words(path: Path) -> int:
    """The prose words of a page."""
    return sum(1 for token in prose_text(page_text(path)).split() if _ALNUM.search(token))


def prose_text(markdown: str) -> str:
    """The prose of a page: code fences, display math, comments and options removed.

    A `{directive}` fence (a figure, an exercise, a solution, a note) keeps its body,
    which a reader reads, and loses its option lines (":label: ...").
    """
    kept, closing, keep_body, math, comment = [], None, False, False, False
    for line in markdown.splitlines():
        stripped = line.strip()
        if comment:
            comment = "-->" not in stripped
            continue
        if closing is None and stripped.startswith("<!--"):
            comment = "-->" not in stripped
            continue
        if closing is not None:
            if stripped == closing:
                closing = None
            elif keep_body and not re.match(r"^:[a-z-]+:", stripped):
                kept.append(line)
            continue
        if stripped.startswith("$$"):
            one_line = stripped.endswith("$$") and len(stripped) > 4
            math = False if math else not one_line
            continue
        if math:
            continue
        opened = _FENCE.match(line)
        if opened:
            marker = opened.group(2)
            rest = stripped[len(marker):]
            closing = marker
            keep_body = rest.startswith("{") and not rest.startswith(("{code", "{math", "{eval"))
            if keep_body:  # a directive's title ("Solution to exercise 4.1") is read too
                kept.append(rest.partition("}")[2])
            continue
        if (stripped.startswith("(") and stripped.endswith(")=")) or re.fullmatch(r"\|?[-:| ]+\|?", stripped or "x"):
            continue
        kept.append(line)
    return _IMAGE.sub(" ", "\n".join(kept))


def goals(path: Path) -> int:
    """The bullets of the page's "What you'll learn" list (0 when it has none)."""
    lines = page_text(path).splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("#", "```{rubric}")) and re.search(r"what you('|’)ll learn", line, re.I):
            count = 0
            for after in lines[i + 1:]:
                if after.startswith("#") or (after.startswith("```") and count):
                    break
                count += bool(re.match(r"^\s{0,1}[-*] ", after))
            return count
    return 0


def toc_pages() -> list[tuple[str, Path]]:
    """(part caption, file) for every page of _toc.yml, in order ("root" for the root)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = [("root", toc["root"])] + [(part["caption"], chapter["file"])
                                         for part in toc["parts"] for chapter in part["chapters"]]
    pages = []
    for part, name in entries:
        stem = ROOT / name
        found = [p for p in (stem.with_suffix(".ipynb"), stem.with_suffix(".md")) if p.exists()]
        if found:
            pages.append((part, found[0]))
    return pages


def limit(part: str) -> int:
    """The word limit of a page in the part with this caption."""
    return CORE_LIMIT if part.lower().startswith("the core") else OTHER_LIMIT


def main() -> int:
    over = 0
    for part, path in toc_pages():
        n, g, cap = words(path), goals(path), limit(part)
        flag = "" if n <= cap and g <= GOAL_LIMIT else "  OVER"
        over += bool(flag)
        print(f"{path.relative_to(ROOT)!s:52} {part[:14]:14} {n:6} / {cap}  goals {g}{flag}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

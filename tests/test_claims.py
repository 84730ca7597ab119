"""The appendix's claims table: enough claims, one verdict each, evidence that exists.

`book/claims.md` checks the source article's claims one by one. Each row links to the
section of the book that measures or proves its verdict, with `{ref}` and a MyST target
`(label)=` above that section's heading. Renaming or deleting such a section would
leave the appendix pointing nowhere; these tests fail first. The checkers are run on a
small broken book as well, to show that they can fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = "book/claims"
VERDICTS = ("holds", "corrected", "depends")
MIN_CLAIMS = 15
COLUMNS = ("#", "claim", "verdict", "evidence", "measured")

# `(label)=` on a line of its own: a MyST target.
TARGET = re.compile(r"^\(([^()\s]+)\)=[ \t]*$", re.MULTILINE)
# {ref}`label` or {ref}`text <label>`.
REF = re.compile(r"\{ref\}`(?:[^`<]*<)?([^`<>]+)>?`")
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]+)`")
BIB_KEY = re.compile(r"^@\w+\{([^,\s]+),", re.MULTILINE)

# What the issue asks the table to cover, each found by a word of its claim cell.
REQUIRED = {
    "the 70 ms floor": r"70 ms",
    "verifying K costs about one token": r"verifying \$?K\$? .*one token",
    "the 400 ms vs 100-105 ms example": r"400 ms",
    "2-3x speedups": r"2-3x",
    '"12x faster" draft': r"12x faster",
    "the acceptance formula": r"min\\?\(1",
    "1.67x at alpha 0.6, K 4": r"1\.67x",
    "the residual": r"residual",
    "the bonus token": r"bonus",
    '"with KV cache"': r"with (a )?KV cache",
    '"bit-identical"': r"bit-identical",
    "acceptance rate > 100%": r"100 ?%",
    "the timing comparison": r"timing comparison",
    "max_new_tokens": r"max_new_tokens",
    "EOS": r"EOS",
    "the 7B + 70B memory figure": r"150 GB",
    "batches processed independently": r"batch independently",
    "drafts 10-100x smaller": r"10-100x",
    "a lower temperature raises acceptance": r"lower temperature",
    "context length (8K, 32K)": r"8K.*32K",
    "the per-token latency target": r"20 ms per token",
}


# --- the checkers ---------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    """The cells of one Markdown table row (no `|` may appear inside a cell)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def claim_rows(text: str) -> list[dict[str, str]]:
    """The rows of the page's claims table: the table whose header starts with COLUMNS.

    Raises:
        ValueError: if there is no such table, or a row has the wrong number of cells.
    """
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines)
               if line.lstrip().startswith("|") and [c.lower() for c in _cells(line)][: len(COLUMNS)] == list(COLUMNS)]
    if not headers:
        raise ValueError(f"no table whose header starts with {' | '.join(COLUMNS)}")
    start = headers[0]
    header = [c.lower() for c in _cells(lines[start])]
    rows = []
    for number, line in enumerate(lines[start + 2 :], start=start + 3):
        if not line.lstrip().startswith("|"):
            break
        cells = _cells(line)
        if len(cells) != len(header):
            raise ValueError(f"line {number}: {len(cells)} cells, the header has {len(header)}")
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _verdict(cell: str) -> str:
    return cell.strip("*_ ").lower()


def bad_verdicts(rows: list[dict[str, str]]) -> list[str]:
    """Rows whose verdict is not one of VERDICTS."""
    return [f"claim {row['#']}: verdict {row['verdict']!r}" for row in rows if _verdict(row["verdict"]) not in VERDICTS]


def toc_pages(root: Path) -> list[Path]:
    """The source file of every page in the book's _toc.yml."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    names = [toc["root"]]
    for part in toc.get("parts", []):
        for chapter in part["chapters"]:  # a chapter, then the sections under it
            names += [chapter["file"]] + [section["file"] for section in chapter.get("sections", [])]
    pages = []
    for name in names:
        pages += [root / f"{name}{suffix}" for suffix in (".md", ".ipynb") if (root / f"{name}{suffix}").is_file()]
    return pages


def defined_targets(pages: list[Path]) -> dict[str, str]:
    """label -> page, for every `(label)=` in a Markdown page or a notebook's markdown cells."""
    targets = {}
    for page in pages:
        if page.suffix == ".ipynb":
            cells = json.loads(page.read_text(encoding="utf-8"))["cells"]
            texts = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
        else:
            texts = [page.read_text(encoding="utf-8")]
        for text in texts:
            for label in TARGET.findall(text):
                targets.setdefault(label, page.name)
    return targets


def missing_targets(text: str, targets: dict[str, str]) -> list[str]:
    """The {ref} labels of `text` that no page defines, in order of first use."""
    return list(dict.fromkeys(label for label in REF.findall(text) if label not in targets))


# --- the book's appendix ----------------------------------------------------------------


@pytest.fixture(scope="module")
def page() -> str:
    return (ROOT / f"{CLAIMS}.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def rows(page: str) -> list[dict[str, str]]:
    return claim_rows(page)


def test_claims_page_is_the_appendix_in_the_toc():
    """book/claims is a page of the book, in the part captioned "Appendices"."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    parts = {part.get("caption"): [c["file"] for c in part["chapters"]] for part in toc["parts"]}
    assert CLAIMS in parts.get("Appendices", []), parts


def test_claims_table_has_at_least_15_claims(rows):
    """The table checks at least 15 of the article's claims, numbered 1, 2, ... in order."""
    assert len(rows) >= MIN_CLAIMS, f"{len(rows)} claims"
    assert [row["#"] for row in rows] == [str(i) for i in range(1, len(rows) + 1)]


def test_every_claim_has_an_allowed_verdict(rows):
    """Each verdict is holds, corrected or depends."""
    assert bad_verdicts(rows) == []


def test_every_claim_has_evidence_and_a_figure(rows):
    """Each row links to the book ({ref}) or cites a source ({cite}), and gives a figure."""
    for row in rows:
        assert row["claim"], f"claim {row['#']} is empty"
        assert REF.search(row["evidence"]) or CITE.search(row["evidence"]), f"claim {row['#']} has no evidence"
        assert re.search(r"\d", row["measured"]), f"claim {row['#']} gives no figure"


def test_every_linked_target_exists(page):
    """Every {ref} label of the appendix is a `(label)=` target on a page of the book."""
    missing = missing_targets(page, defined_targets(toc_pages(ROOT)))
    assert missing == [], f"targets no page defines: {missing}"


def test_every_cited_key_is_in_the_bibliography(page):
    """Every {cite} key of the appendix is an entry of book/references.bib."""
    keys = set(BIB_KEY.findall((ROOT / "book" / "references.bib").read_text(encoding="utf-8")))
    cited = {key.strip() for group in CITE.findall(page) for key in group.split(",")}
    assert cited <= keys, sorted(cited - keys)


@pytest.mark.parametrize("topic", sorted(REQUIRED))
def test_the_claims_the_issue_names_are_checked(rows, topic):
    """The table covers every claim the issue lists (found by a phrase of the claim)."""
    pattern = re.compile(REQUIRED[topic], re.IGNORECASE)
    assert any(pattern.search(row["claim"]) for row in rows), f"no claim about {topic}"


# --- the checkers can fail ----------------------------------------------------------------

BROKEN_PAGE = """\
# Claims

| # | Claim | Verdict | Evidence | Measured |
|---|---|---|---|---|
| 1 | one | holds | {ref}`ch9-present` | 1 ms |
| 2 | two | maybe | {ref}`the proof <ch9-gone>` | 2 ms |
| 3 | three | **corrected** | {cite}`leviathan2023` | 3 ms |
"""


def _small_book(tmp_path: Path, label: str) -> Path:
    """A book of one notebook whose only markdown target is `label`, and the claims page."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "book").mkdir()
    toc = {"format": "jb-book", "root": "book/claims", "parts": [
        {"caption": "Chapters", "chapters": [{"file": "notebooks/09-chapter"}]}]}
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(toc))
    cells = [{"cell_type": "markdown", "metadata": {}, "source": [f"({label})=\n", "## A section\n"]},
             {"cell_type": "code", "metadata": {}, "source": ["(ch9-gone)=\n"], "outputs": [],
              "execution_count": None}]
    (tmp_path / "notebooks" / "09-chapter.ipynb").write_text(json.dumps({"cells": cells}))
    (tmp_path / "book" / "claims.md").write_text(BROKEN_PAGE)
    return tmp_path


def test_checkers_fail_on_a_broken_claims_page(tmp_path):
    """A label no markdown cell defines (a code cell does not count) and a bad verdict are found."""
    root = _small_book(tmp_path, "ch9-present")
    text = (root / "book" / "claims.md").read_text()
    targets = defined_targets(toc_pages(root))
    assert set(targets) == {"ch9-present"}
    assert missing_targets(text, targets) == ["ch9-gone"]
    assert bad_verdicts(claim_rows(text)) == ["claim 2: verdict 'maybe'"]


def test_checker_fails_when_a_target_is_renamed(tmp_path):
    """Renaming the section's target makes its claim's link missing."""
    root = _small_book(tmp_path, "ch9-renamed")
    text = (root / "book" / "claims.md").read_text()
    assert missing_targets(text, defined_targets(toc_pages(root))) == ["ch9-present", "ch9-gone"]


def test_table_parser_rejects_a_malformed_row():
    """A row with a cell too many (a stray `|`) is an error, not a silently shifted verdict."""
    with pytest.raises(ValueError, match="5 cells|6 cells"):
        claim_rows(BROKEN_PAGE.replace("| 1 | one |", "| 1 | one | extra |"))
    with pytest.raises(ValueError, match="no table"):
        claim_rows("# Claims\n\nNo table here.\n")


# --- the generated numbers: scripts/claims.py ---------------------------------------------


def _claims_script():
    """Import scripts/claims.py (scripts/ is not a package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("claims_script", ROOT / "scripts" / "claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


claims_script = _claims_script()


def _glue_output(name: str, value: object) -> dict:
    """A code cell's output as myst-nb's glue stores it."""
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": ""}},
            "data": {claims_script.GLUE_MIME: repr(value)}}


def test_committed_pages_are_what_the_script_writes():
    """book/claims.md and README.md's table equal what `scripts/claims.py --write` writes."""
    diffs = claims_script.stale(claims_script.outputs(claims_script.Sources()))
    assert diffs == [], "\n".join(diffs) + "\nrun `python scripts/claims.py --write`"


def test_every_placeholder_resolves():
    """Each placeholder of the template names a value that exists and takes its format."""
    src = claims_script.Sources()
    template = claims_script.TEMPLATE.read_text(encoding="utf-8")
    found = list(claims_script.PLACEHOLDER.finditer(template))
    assert found, "the template has no placeholders"
    for match in found:
        value, spec = claims_script.value_of(match.group(1), match.group(2), src)
        assert format(value, spec), match.group(0)
    assert "{{" not in claims_script.fill(template, src)


@pytest.mark.parametrize("placeholder, named", [
    ("{{nb:99-no-such-chapter:x}}", "99-no-such-chapter"),
    ("{{nb:05-bonus-token-and-kv-cache:no_such_glue}}", "no_such_glue"),
    ("{{data:no-such-report.json:meta}}", "no-such-report.json"),
    ("{{data:bench-tiny-cpu.json:headline.greedy.no_such_key}}", "no_such_key"),
    ("{{data:bench-tiny-cpu.json:arms.[mode=greedy,name=no such arm].speedup}}", "no such arm"),
    ("{{calc:no_such_calc}}", "no_such_calc"),
    ("{{#:a}} {{#ref:no-such-row}}", "no-such-row"),
    ("{{#:twice}} {{#:twice}}", "twice"),
])
def test_unknown_sources_are_errors_that_name_them(placeholder, named):
    """A notebook, glue, report, key, list element or calculation that does not exist is named."""
    with pytest.raises(claims_script.ClaimsError, match=re.escape(named)):
        claims_script.fill(placeholder, claims_script.Sources())


def test_check_fails_when_a_report_changes(tmp_path, capsys):
    """One benchmark value changed in a copy of the reports: the appendix and README differ, --check fails."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(claims_script.ROOT / "specdec_ref" / "data", data)
    path = data / "bench-tiny-cpu.json"
    report = json.loads(path.read_text())
    arm = next(a for a in report["arms"] if a["mode"] == "greedy" and a["name"] == "specdec_ref k=4 lean")
    assert f"{arm['speedup']:.2f}" == "1.63"
    arm["speedup"] = 1.71
    path.write_text(json.dumps(report))
    assert claims_script.main(["--check", "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert "+| 1 |" in err and "1.71x at best" in err  # the appendix's row 1
    assert "**1.71x**" in err  # the README's table
    assert claims_script.main(["--check"]) == 0  # the committed sources still match


def test_check_fails_when_a_chapter_output_changes(tmp_path, capsys):
    """Chapter 5's glued overshoot count changed in a copy of the notebooks: --check fails on row 12's figure."""
    import shutil

    notebooks = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", notebooks, ignore=shutil.ignore_patterns(".*"))
    path = notebooks / "05-bonus-token-and-kv-cache.ipynb"
    book = json.loads(path.read_text(encoding="utf-8"))
    outputs = [o for cell in book["cells"] for o in cell.get("outputs", [])
               if o.get("metadata", {}).get("scrapbook", {}).get("name") == "overshot_budgets"]
    assert len(outputs) == 1
    count = claims_script.ast.literal_eval(outputs[0]["data"][claims_script.GLUE_MIME])
    outputs[0]["data"][claims_script.GLUE_MIME] = repr(count + 3)
    path.write_text(json.dumps(book), encoding="utf-8")
    assert claims_script.main(["--check", "--notebooks", str(notebooks)]) == 1
    err = capsys.readouterr().err
    assert f"overshoots {count} of them" in err and f"overshoots {count + 3} of them" in err


def test_a_changed_glued_value_changes_the_page(tmp_path):
    """A notebook whose glued value changes gives another page; --check on the old page fails."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cells = [{"cell_type": "code", "metadata": {}, "source": [], "execution_count": 1,
              "outputs": [_glue_output("overshoot_budgets", 7), _glue_output("alpha", 0.7172)]}]
    (notebooks / "05-x.ipynb").write_text(json.dumps({"cells": cells}))
    for chapter in (ROOT / "notebooks").glob("*.ipynb"):  # the README's own placeholders read them
        (notebooks / chapter.name).write_text(chapter.read_text(encoding="utf-8"), encoding="utf-8")
    template = tmp_path / "claims.in.md"
    template.write_text("overshoots {{nb:05-x:overshoot_budgets:d}} budgets, alpha {{nb:05-x:alpha:.3f}}\n")
    page, readme = tmp_path / "claims.md", tmp_path / "README.md"
    readme.write_text(claims_script.README.read_text(encoding="utf-8"))
    args = ["--notebooks", str(notebooks), "--template", str(template), "--page", str(page), "--readme", str(readme)]
    assert claims_script.main(["--write", *args]) == 0
    assert page.read_text() == "overshoots 7 budgets, alpha 0.717\n"
    assert claims_script.main(["--check", *args]) == 0
    cells[0]["outputs"][0] = _glue_output("overshoot_budgets", 4)
    (notebooks / "05-x.ipynb").write_text(json.dumps({"cells": cells}))
    assert claims_script.main(["--check", *args]) == 1


def test_rows_are_numbered_in_order():
    """`{{#:label}}` numbers the rows 1, 2, ...; `{{#ref:label}}` gives a row's number."""
    text = "| {{#:b}} | x |\n| {{#:a}} | see row {{#ref:b}} |\n"
    assert claims_script.number_rows(text) == "| 1 | x |\n| 2 | see row 1 |\n"


def test_data_paths_select_list_elements_and_dotted_keys():
    """`[k=v]` picks one element, integers index, and a key may hold dots (t1.0)."""
    report = {"headline": {"t1.0": {"speedup": 1.5}}, "arms": [{"name": "a", "x": 1}, {"name": "b", "x": 2}]}
    assert claims_script.lookup(report, "headline.t1.0.speedup") == 1.5
    assert claims_script.lookup(report, "arms.[name=b].x") == 2
    assert claims_script.lookup(report, "arms.0.x") == 1
    with pytest.raises(claims_script.ClaimsError, match="2 elements"):
        claims_script.lookup({"arms": [{"n": 1}, {"n": 1}]}, "arms.[n=1]")


# --- the practical page: scripts/using_page.py ---------------------------------------------


def _using_script():
    """Import scripts/using_page.py (it imports claims.py from beside it)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("using_page_script", ROOT / "scripts" / "using_page.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_using_page_is_what_its_script_writes():
    """book/using-speculative-decoding.md equals what `scripts/using_page.py --write` writes."""
    using = _using_script()
    diffs = claims_script.stale(using.outputs(using.Sources()))
    assert diffs == [], "\n".join(diffs) + "\nrun `python scripts/using_page.py --write`"


def test_using_page_check_fails_when_a_report_changes(tmp_path, capsys):
    """The batch-16 row of batched-throughput.json changed in a copy: the page's figure differs, --check fails."""
    import shutil

    using = _using_script()
    data = tmp_path / "data"
    shutil.copytree(ROOT / "specdec_ref" / "data", data)
    path = data / "batched-throughput.json"
    report = json.loads(path.read_text())
    row = next(r for r in report["rows"] if r["batch_size"] == 16)
    row["speculative_over_generate_cpu"] = 1.234
    path.write_text(json.dumps(report))
    assert using.main(["--check", "--data", str(data)]) == 1
    assert "1.23x at 16" in capsys.readouterr().err
    assert using.main(["--check"]) == 0

"""scripts/browser_check.py: its warnings, its skip without Chromium, and the page checks in a real browser."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("browser_check", ROOT / "scripts" / "browser_check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


CLEAN = {"untypeset": [], "rawTex": [], "rawMarkdown": [], "math": 0, "mathjax": True, "broken": [],
         "noAlt": [], "uncaptioned": [], "scrolling": [], "failed": [], "colab": [], "widgets": 0,
         "unrenderedWidgets": 0, "exceptions": [], "refused": []}


def test_a_long_page_warns_and_a_split_table_fails(monkeypatch):
    """A page over the height limit is a warning; a table split over output blocks fails the page
    (a warning only where SPLIT_TABLES_FAIL is turned off)."""
    report = {**CLEAN, "height": check.MAX_PAGE_HEIGHT + 1, "splitTables": ['2 output blocks: "rows  1  2"']}
    assert check.warnings({"height": check.MAX_PAGE_HEIGHT, "splitTables": []}) == []
    assert check.problems("a.html", False, {**CLEAN, "splitTables": []}, offline=True) == []
    warned = check.warnings(report)
    assert len(warned) == 1 and f"{check.MAX_PAGE_HEIGHT + 1:,} px tall" in warned[0]
    assert check.problems("a.html", False, report, offline=True) == ['table split over 2 output blocks: "rows  1  2"']
    monkeypatch.setattr(check, "SPLIT_TABLES_FAIL", False)
    assert len(check.warnings(report)) == 2 and check.problems("a.html", False, report, offline=True) == []


def test_the_check_is_skipped_without_chromium(monkeypatch, capsys, tmp_path):
    """No Chromium on the machine: the check says it is skipped and passes."""
    monkeypatch.setattr(check, "find_browser", lambda: None)
    assert check.main(["--build", str(tmp_path)]) == 0
    assert "skipped, no Chromium" in capsys.readouterr().out


ROW = '<div class="output stream"><div class="highlight"><pre>{}\n</pre></div></div>'


@pytest.mark.slow
@pytest.mark.skipif(check.find_browser() is None, reason="no Chromium on this machine")
def test_browser_check_warns_on_a_long_page_and_fails_on_an_exception(tmp_path, capsys):
    """In Chromium: a tall page warns; a split table and an uncaught exception fail the page."""
    pytest.importorskip("playwright")
    split = ROW.format("attention   1 token") + ROW.format("sdpa          10.23") + ROW.format("one line, no table")
    page = ('<html><body><main><article><div class="cell_output">{}</div>'
            f'<div style="height: {check.MAX_PAGE_HEIGHT + 1000}px"></div>{{}}</article></main></body></html>')
    (tmp_path / "index.html").write_text(page.format(split, ""))
    assert check.main(["--build", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "- table split over 2 output blocks: \"attention   1 token\"" in out
    height = int(re.search(r"WARNING index.html: ([\d,]+) px tall at 1280 px", out)[1].replace(",", ""))
    assert check.MAX_PAGE_HEIGHT + 1000 <= height < check.MAX_PAGE_HEIGHT + 1200
    (tmp_path / "index.html").write_text(page.format("", "<script>null.boom()</script>"))
    assert check.main(["--build", str(tmp_path)]) == 1
    assert "JavaScript exception: TypeError" in capsys.readouterr().out

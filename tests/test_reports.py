"""The reports the chapters read ship inside the package: in the wheel, and through importlib.resources."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

from specdec_ref.reports import REPORTS_DIR, read_report, report_names, report_path

ROOT = Path(__file__).resolve().parent.parent
# A report name in a notebook's code: "ch4-audit.json", f"size-sweep-{kind}.json", "size-sweep-*.json".
# Globs a chapter reads when they match, and says so when they do not: the GPU reports
# (`make bench-gpu` writes them; none is committed yet).
OPTIONAL = {"bench-*-cuda-*.json"}
NAME = re.compile(r'"((?:ch\d|bench|size-sweep|prompt|batched)[\w{}*-]*\.json)"')


def _names_in_notebooks() -> set[str]:
    """Every report name (or glob) the notebooks' code cells mention."""
    names = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                names |= set(NAME.findall("".join(cell["source"])))
    return names


def _globs(names: set[str]) -> list[str]:
    """The names as globs ({...} fields become *), the optional ones (any GPU report) left out."""
    globs = {re.sub(r"\{[^}]*\}", "*", name) for name in names}
    return sorted(g for g in globs if not any(fnmatch(g, optional) for optional in OPTIONAL))


def test_notebooks_read_no_path_into_the_repository():
    """No code cell builds a path to the repository's data: they name reports and read them from the package."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code":
                assert "book/data" not in source and '"data"' not in source, path.name


def test_every_report_a_notebook_names_is_shipped():
    """Each report name in the notebooks matches at least one file in specdec_ref/data/."""
    names = _globs(_names_in_notebooks())
    assert {"ch4-audit.json", "prompt-lookup.json", "batched-throughput.json", "bench-tiny-cpu.json"} <= set(names)
    for pattern in names:
        assert report_names(pattern), f"no shipped report matches {pattern!r}"
    with pytest.raises(FileNotFoundError, match="ships no report named 'nope.json'"):
        report_path("nope.json")


@pytest.mark.slow
def test_the_wheel_holds_every_report_the_notebooks_read(tmp_path):
    """A wheel built from the tree (offline, no build isolation) holds every file of specdec_ref/data/,
    and so every report the notebooks name; installed from it, a report is read through importlib.resources
    from the installed package, not from this tree."""
    source = tmp_path / "src"
    # Build from a copy of what git tracks, so untracked files here cannot leak into the wheel.
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next((tmp_path / "dist").glob("specdec_ref-*.whl"))
    inside = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"specdec_ref/data/{path.name}" for path in REPORTS_DIR.glob("*.json")}
    assert "specdec_ref/reports.py" in inside
    assert shipped and shipped <= inside, sorted(shipped - inside)
    for pattern in _globs(_names_in_notebooks()):
        assert any(Path(name).match(f"specdec_ref/data/{pattern}") for name in inside), pattern

    # Installed from the wheel (a pure-Python wheel installs by unpacking) ahead of this checkout on sys.path,
    # and run from elsewhere: the reports come from the installed copy.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import specdec_ref;"
             "from specdec_ref.reports import read_report, report_path;"
             "print(json.dumps([specdec_ref.__file__, str(report_path('ch4-audit.json')),"
             " read_report('ch4-audit.json')['written_by']]))")
    found = subprocess.run([sys.executable, "-c", probe, str(site)], capture_output=True, text=True, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    package, path, written_by = json.loads(found.stdout.splitlines()[-1])
    assert Path(package).is_relative_to(site)
    assert Path(path).is_relative_to(site) and not Path(path).is_relative_to(ROOT)
    assert written_by == read_report("ch4-audit.json")["written_by"]

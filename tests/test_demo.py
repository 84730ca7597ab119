"""Smoke test of the demo, `python -m specdec_ref`, on random-init models of the tiny pair's shapes."""

from __future__ import annotations

import re

from conftest import torch_threads

from specdec_ref.__main__ import main


def test_demo_prints_iterations_stats_and_speedups(capsys):
    """The demo shows each iteration, matches the target's greedy output and reports both speedups."""
    with torch_threads():
        main(["--pair", "random", "--max-new-tokens", "8", "--k", "3", "--repeats", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert "random-init" in out  # says that these are not trained models
    assert "specdec_ref.fast.prepare on cpu:" in out and "LeanForward" in out  # the README snippet's path
    assert re.search(r"^\s+1\. drafted( \d+){3}$", out, re.MULTILINE)
    assert re.search(r"accepted [0-3]/3, then (bonus|correction): \d+", out)
    assert "new tokens 8 in" in out
    assert "identical to the target's own greedy generate: yes" in out
    assert len(re.findall(r"speculative speedup: \d+\.\d\dx", out)) == 2

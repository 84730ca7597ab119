"""Smoke test of `python -m specdec_ref.bench` on tiny random-init models, and its greedy check."""

from __future__ import annotations

import json

import pytest
import torch

from specdec_ref.bench.arms import Arm, RunRecord
from specdec_ref.bench.run import format_table, greedy_mismatches, main

MODES = ("greedy", "t1.0", "t0.7")
K_VALUES = (1, 3)
ARM_NAMES = {"hf generate", "hf assisted default", "hf assisted k=1", "hf assisted k=3", "specdec_ref autoregressive",
             "specdec_ref k=4 nocache", "specdec_ref k=1", "specdec_ref k=3", "specdec_ref heuristic",
             "specdec_ref model"}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One short benchmark run: its JSON report and what it printed."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    argv = ["--pair", "random", "--quick", "--max-new-tokens", "12", "--k-values", "1,3", "--threads", "1",
            "--random-target-layers", "2", "--random-width", "64", "--random-vocab", "256", "--no-progress",
            "--out", str(out)]
    threads = torch.get_num_threads()
    try:
        return main(argv), json.loads(out.read_text())
    finally:
        torch.set_num_threads(threads)  # --threads is process-wide: leave other tests as they were


def test_bench_writes_the_report_it_returns(bench_run):
    """The JSON file holds the report, with the top-level keys and the pass costs the analysis reads."""
    returned, written = bench_run
    assert written == json.loads(json.dumps(returned))
    assert set(written) == {"meta", "cost_ratio", "verify_cost", "arms", "greedy_identical", "greedy_mismatches"}
    meta = written["meta"]
    for key in ("pair", "device", "dtype", "torch", "transformers", "date", "prompts", "max_new_tokens", "repeats",
                "threads"):
        assert key in meta, key
    assert meta["pair"] == "random" and meta["max_new_tokens"] == 12 and meta["threads"] == 1
    assert written["cost_ratio"] > 0
    assert set(written["verify_cost"]) == {str(k) for k in range(1, 9)}
    assert all(v > 0 for v in written["verify_cost"].values())


def test_bench_runs_every_arm_in_every_mode(bench_run):
    """Each mode has the baseline, assisted generation and every specdec_ref arm, with the right fields."""
    _, report = bench_run
    for mode in MODES:
        arms = {arm["name"]: arm for arm in report["arms"] if arm["mode"] == mode}
        assert set(arms) == ARM_NAMES
        assert arms["hf generate"]["speedup"] == pytest.approx(1.0)
        assert arms["specdec_ref k=4 nocache"]["use_cache"] is False
        assert (arms["specdec_ref k=3"]["impl"], arms["specdec_ref k=3"]["k"]) == ("specdec_ref", 3)
        assert arms["hf assisted k=3"]["schedule"] == "fixed" and arms["hf assisted default"]["schedule"] == "default"
        for arm in arms.values():
            tps = arm["tokens_per_s"]
            assert 0 < tps["q1"] <= tps["median"] <= tps["q3"]
            assert arm["speedup"] > 0
            assert 0 <= arm["overhead_share"] <= 1
            assert arm["block_efficiency"] >= 1
            assert arm["block_efficiency"] * arm["target_calls_per_token"] == pytest.approx(1.0)
            if arm["schedule"] is None:  # target alone: no drafts, one target pass per token
                assert arm["alpha"] is None and arm["block_efficiency"] == pytest.approx(1.0)
            else:
                assert 0 <= arm["alpha"] <= 1
            if arm["k"] is not None:
                assert arm["mean_k"] <= arm["k"]


def test_bench_greedy_arms_match_the_baseline(bench_run):
    """Greedy: every arm, transformers' and ours, produced the baseline's tokens, and the table says so."""
    _, report = bench_run
    assert report["greedy_identical"] is True
    assert report["greedy_mismatches"] == []
    table = format_table(report)
    assert "every arm produced the baseline's tokens on every prompt: yes" in table
    assert all(name in table for name in ARM_NAMES)


def test_greedy_check_reports_a_mismatch():
    """The greedy check flags an arm whose tokens differ from the baseline's, at the first differing position."""
    baseline = Arm("hf generate", "transformers", "greedy", None, True, None)
    ours = Arm("specdec_ref k=2", "specdec_ref", "greedy", 2, True, "fixed")
    sampled = Arm("specdec_ref k=2", "specdec_ref", "t1.0", 2, True, "fixed")

    def record(tokens):
        return RunRecord(tokens, 1.0, 0.5, len(tokens), 0, None, None)

    records = {baseline: [(0, 0, record([5, 6, 7]))], ours: [(0, 0, record([5, 6, 7])), (1, 0, record([5, 9, 7]))],
               sampled: [(0, 0, record([1, 2, 3]))]}
    assert greedy_mismatches(records) == [{"arm": "specdec_ref k=2", "prompt": 0, "repeat": 1, "first_difference": 1}]


def test_bench_assisted_counters_agree_with_ours_when_greedy(bench_run):
    """Greedy with the same K, transformers' assisted generation and specdec_ref draft and accept the same tokens.

    So alpha derived from the hooks (accepted = new tokens - target passes) and K taken from the
    assistant's generation config must give the same figures as the decoder's own counters.
    """
    _, report = bench_run
    arms = {arm["name"]: arm for arm in report["arms"] if arm["mode"] == "greedy"}
    for k in K_VALUES:
        ours, theirs = arms[f"specdec_ref k={k}"], arms[f"hf assisted k={k}"]
        for key in ("alpha", "block_efficiency", "mean_k", "draft_calls_per_token"):
            assert theirs[key] == pytest.approx(ours[key]), (k, key)

"""The cross-tokenizer benchmark (`bench.vocab`) and audit (`vocab_audit`): structure and invariants, tiny counts."""

from __future__ import annotations

import math

import pytest

from specdec_ref.analysis import expected_tokens
from specdec_ref.bench.vocab import ARMS, CROSS_ARMS, VocabBenchConfig, build, run_benchmark
from specdec_ref.bench.vocab_audit import VocabAuditConfig, run_audit

CONFIG = VocabBenchConfig(num_prompts=1, repeats=1, max_new_tokens=10, cost_repeats=2)


@pytest.fixture(scope="module")
def report() -> dict:
    return run_benchmark(CONFIG, progress=False)


def test_report_has_every_mode_and_arm(report):
    """Both modes, all four arms, the costs and the run's machine and versions are recorded."""
    assert set(report["arms"]) == {"greedy", "t1.0"}
    for block in report["arms"].values():
        assert tuple(block) == ARMS
    meta = report["meta"]
    assert meta["threads"] == 1 and meta["config"]["num_draft_tokens"] == 4
    assert {"machine", "torch", "transformers"} <= set(meta)
    assert set(report["costs"]["cost_ratio"]) == {"cross", "same"}
    assert report["costs"]["verify_cost"][0] == 1.0 and set(report["costs"]["verify_cost"]) == set(range(5))


def test_greedy_arms_emit_the_targets_tokens(report):
    """Every greedy call of every arm gives the target's greedy tokens."""
    for arm, entry in report["arms"]["greedy"].items():
        assert entry["greedy_matches_target"] == entry["calls"] == CONFIG.num_prompts * CONFIG.repeats, arm


def test_counts_speedups_and_shares_are_sane(report):
    """Every call emits max_new_tokens; speedups are positive; time shares lie in [0, 1]; only cross arms
    re-tokenize; the target alone makes one call per token."""
    for mode, block in report["arms"].items():
        for arm, entry in block.items():
            assert entry["new_tokens"] == entry["calls"] * CONFIG.max_new_tokens, (mode, arm)
            assert entry["speedup"] > 0 and entry["ms_per_token"] > 0
            for name in ("share_target_forward", "share_draft_forward", "share_retokenize", "share_other"):
                assert 0 <= entry[name] <= 1, (mode, arm, name)
            assert (entry["share_retokenize"] > 0) == (arm in CROSS_ARMS), (mode, arm)
            assert entry["tokens_per_target_call"] >= 1
        assert block["target"]["tokens_per_target_call"] == 1 and block["target"]["speedup"] == 1


def test_predictions_are_chapter_6s_model(report):
    """Each draft arm's prediction is E[tokens](alpha, K) / (K c + v(K)) with its own c."""
    costs, k = report["costs"], CONFIG.num_draft_tokens
    for block in report["arms"].values():
        for arm in ARMS[1:]:
            entry, model = block[arm], block[arm]["model"]
            c = costs["cost_ratio"]["same" if arm == "same_tokenizer" else "cross"]
            assert model["cost_ratio"] == c
            tokens = expected_tokens(entry["alpha"], k)
            assert math.isclose(model["predicted_speedup"], tokens / (k * c + costs["verify_cost"][k]))
            assert model["round_cost_as_run_steps"] > 0 and model["retokenize_steps_per_round"] >= 0


@pytest.mark.parametrize("change", [{"repeats": 0}, {"modes": ("t0.5",)}])
def test_bad_config_raises(change):
    """A count below 1 or an unknown mode is refused, named in the message."""
    config = VocabBenchConfig(**{**vars(CONFIG), **change})
    with pytest.raises(ValueError, match="repeats|modes"):
        build(config)


def test_vocab_audit_records_every_verdict():
    """The audit report has three sampled rows and three greedy rows, each with a verdict, and the
    greedy rows of our drafters match the target on every prompt."""
    config = VocabAuditConfig(num_runs=2, max_new_tokens=12, greedy_prompts=1, greedy_new_tokens=8)
    data = run_audit(config)
    assert data["versions"]["transformers"]
    assert len(data["sampled"]) == 3 and len(data["greedy"]) == 3
    for row in data["sampled"]:
        assert isinstance(row["passed"], bool) and row["summary"].startswith(("PASS", "FAIL"))
        assert row["error"] is not None or row["num_samples"] > 0
    for row in data["greedy"]:
        assert row["prompts"] == 1 and isinstance(row["passed"], bool)
    assert all(row["passed"] for row in data["greedy"] if row["implementation"].startswith("specdec_ref"))

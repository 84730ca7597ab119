"""Reading a benchmark report: each fixed-K arm's prediction from the costs it paid, next to its measurement."""

from __future__ import annotations

import json
import math

import pytest

from specdec_ref.analysis import expected_tokens
from specdec_ref.bench.report import arm_cost_ratio, predicted_vs_measured, speedup_by_k


def arm(name: str, mode: str = "greedy", k: int | None = 4, *, impl: str = "specdec_ref",
        schedule: str | None = "fixed", use_cache: bool = True, **fields) -> dict:
    """An arm entry as `bench.summary.summarize` writes it."""
    return {"name": name, "impl": impl, "mode": mode, "k": k, "schedule": schedule, "use_cache": use_cache,
            "lean": False, "fast": False, "alpha_per_token": None, "block_efficiency": None, **fields}


def test_predicted_vs_measured_reads_cached_fixed_k_specdec_arms(tmp_path):
    """Rows come from specdec_ref fixed-K cached arms only; predictions use the report's c and v(K)."""
    report = {
        "cost_ratio": 0.2,
        "verify_cost": {"2": 1.1, "4": 1.3},
        "arms": [
            arm("specdec_ref autoregressive", k=None, schedule=None, speedup=1.0),
            arm("hf assisted k=4", impl="transformers", speedup=1.4),
            arm("specdec_ref k=4", speedup=1.5, alpha_per_token=0.7, block_efficiency=2.7),
            arm("specdec_ref k=4 nocache", use_cache=False, speedup=0.9, alpha_per_token=0.7),
            arm("specdec_ref k=2", "t1.0", 2, speedup=1.2, alpha_per_token=0.5),
            arm("specdec_ref k=8", "t1.0", 8, speedup=1.1, alpha_per_token=0.5),
            arm("specdec_ref heuristic", "t1.0", None, schedule="heuristic", speedup=1.3, alpha_per_token=0.5),
        ],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    rows = predicted_vs_measured(path)
    assert [(r.name, r.mode, r.k) for r in rows] == [("specdec_ref k=4", "greedy", 4), ("specdec_ref k=2", "t1.0", 2),
                                                      ("specdec_ref k=8", "t1.0", 8)]
    assert rows[0].predicted_speedup == pytest.approx(expected_tokens(0.7, 4) / (4 * 0.2 + 1.3))
    assert rows[0].measured_speedup == 1.5 and rows[0].block_efficiency == 2.7
    assert rows[0].cost_model_speedup == pytest.approx(2.7 / (4 * 0.2 + 1.3))
    assert rows[1].predicted_speedup == pytest.approx(expected_tokens(0.5, 2) / (2 * 0.2 + 1.1))
    assert math.isnan(rows[1].block_efficiency)
    assert math.isnan(rows[2].predicted_speedup) and math.isnan(rows[2].cost_model_speedup)  # no measured v(8)
    assert [r.predicted_speedup for r in predicted_vs_measured(report)][:2] == [r.predicted_speedup for r in rows][:2]
    # The baseline is a faster variant of generate: generate as run is 0.8x of it, so the
    # predictions (in steps of the target as run) scale by 0.8 in that mode only.
    as_run = arm("hf generate", k=None, impl="transformers", schedule=None, speedup=0.8)
    scaled = predicted_vs_measured({**report, "arms": [as_run, *report["arms"]]})
    assert scaled[0].predicted_speedup == pytest.approx(0.8 * rows[0].predicted_speedup)
    assert scaled[0].cost_model_speedup == pytest.approx(0.8 * rows[0].cost_model_speedup)
    assert scaled[1].predicted_speedup == pytest.approx(rows[1].predicted_speedup)


def test_each_arm_is_predicted_with_the_costs_its_path_paid():
    """Lean arms use the lean draft's c, the loop's c (timed after a target pass) wins where present,
    and fast arms use the fast path's c and v(K), scaled by its target-only arm over the baseline."""
    plain = arm("specdec_ref k=2", k=2, speedup=1.2, alpha_per_token=0.6)
    lean = {**plain, "name": "specdec_ref k=2 lean", "lean": True}
    report = {"cost_ratio": 0.1, "lean_cost_ratio": 0.05, "verify_cost": {"2": 1.2}, "arms": [plain, lean]}
    assert [arm_cost_ratio(report, a) for a in (plain, lean)] == [0.1, 0.05]
    looped = {**report, "loop_cost_ratio": 0.15, "lean_loop_cost_ratio": 0.08}
    assert [arm_cost_ratio(looped, a) for a in (plain, lean)] == [0.15, 0.08]
    rows = predicted_vs_measured(looped)
    assert [r.predicted_speedup for r in rows] == pytest.approx(
        [expected_tokens(0.6, 2) / (2 * c + 1.2) for c in (0.15, 0.08)])
    fast = {**plain, "name": "specdec_ref k=2 fast", "fast": True}
    alone = arm("specdec_ref autoregressive fast", k=None, schedule=None, fast=True, speedup=2.0)
    with_fast = {**looped, "arms": [alone, fast], "fast_path": {"fast": {"cost_ratio": 0.05,
                                                                         "verify_cost": {"2": 1.0}}}}
    assert arm_cost_ratio(with_fast, fast) == 0.05
    (row,) = predicted_vs_measured(with_fast)
    assert row.fast and row.predicted_speedup == pytest.approx(2.0 * expected_tokens(0.6, 2) / (2 * 0.05 + 1.0))


def test_speedup_by_k_reads_one_implementation_path_and_mode():
    """Fixed-K cached arms of the asked implementation, path and mode, sorted by K; others left out."""
    report = {"arms": [
        arm("hf generate", k=None, impl="transformers", schedule=None, speedup=1.0),
        arm("hf assisted k=4", impl="transformers", speedup=1.03),
        arm("hf assisted k=2", k=2, impl="transformers", speedup=0.97),
        arm("specdec_ref k=4", speedup=1.18),
        arm("specdec_ref k=4 nocache", use_cache=False, speedup=0.34),
        arm("specdec_ref k=4", "t1.0", speedup=1.14),
        arm("specdec_ref model", k=None, schedule="model", speedup=1.22),
        arm("specdec_ref k=4 lean", lean=True, speedup=1.3),
        arm("specdec_ref k=4 fast", fast=True, speedup=1.9),
    ]}
    assert speedup_by_k(report, mode="greedy", impl="transformers") == {2: 0.97, 4: 1.03}
    assert list(speedup_by_k(report, mode="greedy", impl="transformers")) == [2, 4]
    assert speedup_by_k(report, mode="greedy", impl="specdec_ref") == {4: 1.18}
    assert speedup_by_k(report, mode="t1.0", impl="specdec_ref") == {4: 1.14}
    assert speedup_by_k(report, mode="t0.7", impl="specdec_ref") == {}
    assert speedup_by_k(report, mode="greedy", impl="specdec_ref", lean=True) == {4: 1.3}
    assert speedup_by_k(report, mode="greedy", impl="specdec_ref", fast=True) == {4: 1.9}


def test_committed_benchmark_report_is_readable():
    """specdec_ref/data/bench-tiny-cpu.json gives a prediction and a measurement for every K the chapter draws."""
    from specdec_ref.reports import report_path

    path = report_path("bench-tiny-cpu.json")
    rows = predicted_vs_measured(path)
    report = json.loads(path.read_text())
    for mode in ("greedy", "t1.0"):
        for lean in (False, True):
            ks = [r.k for r in rows if r.mode == mode and r.lean == lean]
            assert ks == report["meta"]["k_values"]
            assert list(speedup_by_k(path, mode=mode, impl="specdec_ref", lean=lean)) == ks
        assert list(speedup_by_k(path, mode=mode, impl="transformers")) == ks
    assert all(0 < r.alpha < 1 and 0 < r.predicted_speedup < 10 and r.measured_speedup > 0 for r in rows)

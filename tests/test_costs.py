"""The reference costs report: rounds, medians within their ranges, and the reader."""

from __future__ import annotations

import json
import time

import pytest
from conftest import make_model

from specdec_ref.bench.costs import (
    REPORT,
    ReferenceCosts,
    costs_from_report,
    costs_report,
    measure_rounds,
    reference_costs,
)
from specdec_ref.bench.scale import SizePoint
from specdec_ref.reports import read_report
from specdec_ref.timing import ISA_FLAGS, cpu_flags

META = {"pair": "random", "dtype": "float32", "threads": 1, "context": 64, "rounds": 2, "repeats": 1,
        "clock": "thread_time: test"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Two rounds of one timed pass per size on a random Llama pair, written and read back."""
    draft, target = make_model("llama", layers=1, seed=2), make_model("llama", layers=2, seed=1, positions=128)
    points = measure_rounds(draft, target, rounds=2, repeats=1, clock=time.thread_time)
    path = tmp_path_factory.mktemp("costs") / "costs.json"
    path.write_text(json.dumps(costs_report(points, META)))
    return json.loads(path.read_text())


def test_report_keeps_every_round_and_a_summary_of_each_cost(written):
    """meta as given; one entry per round with tau_p, tau_q, c and v(0..8); a summary of each."""
    assert written["meta"] == META and len(written["rounds"]) == 2
    for entry in written["rounds"]:
        assert set(entry) == {"tau_p", "tau_q", "c", "verify_cost"}
        assert list(entry["verify_cost"]) == [str(k) for k in range(9)]
        assert entry["c"] == pytest.approx(entry["tau_q"] / entry["tau_p"])
    assert set(written["summary"]) == {"tau_p", "tau_q", "c", "verify_cost"}
    assert list(written["summary"]["verify_cost"]) == [str(k) for k in range(9)]


def test_summary_median_lies_within_min_and_max(written):
    """Every summarised cost: min <= median <= max, and min, max are the rounds' extremes."""
    summary = written["summary"]
    spreads = [summary[key] for key in ("tau_p", "tau_q", "c")] + list(summary["verify_cost"].values())
    for spread in spreads:
        assert spread["min"] <= spread["median"] <= spread["max"]
    taus = [entry["tau_p"] for entry in written["rounds"]]
    assert (summary["tau_p"]["min"], summary["tau_p"]["max"]) == (min(taus), max(taus))


def test_verifying_no_draft_costs_one_step(written):
    """v(0) = tau_p(1) / tau_p = 1 in every round and in the summary."""
    assert all(entry["verify_cost"]["0"] == 1.0 for entry in written["rounds"])
    assert written["summary"]["verify_cost"]["0"] == {"median": 1.0, "min": 1.0, "max": 1.0}


def test_reader_gives_the_medians_and_ranges(written):
    """costs_from_report: medians and (min, max) of the summary, integer K, the round count."""
    costs = costs_from_report(written)
    summary = written["summary"]
    assert isinstance(costs, ReferenceCosts) and costs.rounds == 2
    assert costs.cost_ratio == summary["c"]["median"]
    assert costs.cost_ratio_range == (summary["c"]["min"], summary["c"]["max"])
    assert sorted(costs.verify_cost) == list(range(9)) and costs.verify_cost[0] == 1.0
    assert costs.verify_cost_range[4] == (summary["verify_cost"]["4"]["min"], summary["verify_cost"]["4"]["max"])
    assert costs.target_step_s == summary["tau_p"]["median"] and costs.draft_step_s == summary["tau_q"]["median"]
    with pytest.raises(AttributeError):
        costs.cost_ratio = 0.0  # frozen


def test_committed_reference_is_seven_rounds_of_the_tiny_pair_at_one_thread():
    """reference_costs(): the committed report's setting, and each median within its range."""
    costs = reference_costs()
    meta = read_report(REPORT)["meta"]
    assert (meta["pair"], meta["dtype"], meta["threads"], meta["context"]) == ("tiny", "float32", 1, 64)
    assert costs.rounds == meta["rounds"] == 7 and set(meta["cpu_flags"]) <= set(ISA_FLAGS)
    low, high = costs.cost_ratio_range
    assert 0 < low <= costs.cost_ratio <= high < 1
    assert 0 < costs.target_step_range[0] <= costs.target_step_s <= costs.target_step_range[1]


def test_within_noise_is_overlap_of_the_ranges():
    """Two v(K) whose ranges overlap are within noise; disjoint ones are not."""
    data = {"meta": {"clock": "x"}, "rounds": [{"c": 0.1, "verify_cost": {"0": 1.0, "1": 1.2, "2": 1.25}}],
            "summary": {"c": {"median": 0.1, "min": 0.1, "max": 0.1},
                        "tau_p": {"median": 1.0, "min": 1.0, "max": 1.0},
                        "tau_q": {"median": 0.1, "min": 0.1, "max": 0.1},
                        "verify_cost": {"0": {"median": 1.0, "min": 1.0, "max": 1.0},
                                        "1": {"median": 1.2, "min": 1.1, "max": 1.3},
                                        "2": {"median": 1.25, "min": 1.2, "max": 1.4}}}}
    costs = costs_from_report(data)
    assert costs.within_noise(1, 2) and not costs.within_noise(0, 1)


def test_near_best_keeps_the_k_whose_speedup_range_reaches_the_best():
    """A K is near the best when its S(K) with v(K) at its bottom reaches the best's S with v at its top."""
    # Two rounds that agree on v(1), v(2) = 1 and disagree on v(3): 1 or 3.
    points = [SizePoint("r", 1, 1.0, 0.1, {0: 1.0, 1: 1.0, 2: 1.0, 3: v}) for v in (1.0, 3.0)]
    costs = costs_from_report(costs_report(points, META))
    assert costs.best_k_by_round(0.9, max_k=3) == [3, 2]
    low, high = costs.speedup_range(0.9, 3)
    assert low < high and costs.speedup_range(0.9, 2)[0] == costs.speedup_range(0.9, 2)[1]
    assert costs.near_best(0.9, max_k=3) == [2, 3]  # K = 1 falls short of the best's (K = 2) range


def test_cpu_flags_keeps_only_the_listed_instruction_sets():
    """From a /proc/cpuinfo text: the ISA_FLAGS present, in ISA_FLAGS' order."""
    text = "model name\t: Some CPU\nflags\t\t: fpu sse2 avx512_bf16 avx2 amx_tile\n"
    assert cpu_flags(text) == ["avx2", "avx512_bf16"]
    assert cpu_flags("no flags here") == []


def test_rounds_must_be_positive():
    """rounds = 0 is refused with a message naming the argument."""
    model = make_model("llama", layers=1)
    with pytest.raises(ValueError, match="rounds"):
        measure_rounds(model, model, rounds=0)

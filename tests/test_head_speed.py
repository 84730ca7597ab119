"""The draft heads' speed benchmark (`bench.head_speed`): the report's schema, greedy exactness
against `generate`, and chapter 6's prediction, on one prompt and a few arms."""

from __future__ import annotations

import json

import pytest
from conftest import torch_threads

from specdec_ref.bench.head_costs import predicted_speedup
from specdec_ref.bench.head_speed import ARMS, MODES, main, run
from specdec_ref.timing import ISA_FLAGS

SUBSET = ["generate sdpa", "draft tree (2,2,1,1)", "EAGLE chain K=4", "EAGLE tree (4,2,2,1)", "Medusa tree (2,2,1,1)"]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("head-speed") / "report.json"
    with torch_threads():
        main(["--prompts", "1", "--max-new-tokens", "8", "--rounds", "1", "--threads", "1",
              "--cost-repeats", "2", "--arms", *SUBSET, "--out", str(out)])
    return json.loads(out.read_text())


@pytest.mark.slow
def test_report_schema_has_every_mode_arm_and_spread(report):
    """Meta, pass costs, and per mode the fastest generate and every arm's figures with their spread."""
    meta = report["meta"]
    assert meta["prompts"] == 1 and meta["new_tokens"] == 8 and meta["rounds"] == 1 and meta["threads"] == 1
    assert {"torch", "transformers", "date", "cpu_model", "cpu_flags", "note"} <= set(meta)
    assert set(meta["cpu_flags"]) <= set(ISA_FLAGS)
    assert report["pass_costs_cpu_ms"]["target_1"] > 0 and "medusa" in report["pass_costs_cpu_ms"]
    assert set(report["modes"]) == set(MODES) and isinstance(report["model_note"], str)
    for block in report["modes"].values():
        assert block["fastest_generate"] == {"wall": "generate sdpa", "cpu": "generate sdpa"}
        assert list(block["arms"]) == SUBSET
        for row in block["arms"].values():
            for key in ("tokens_per_s_wall", "tokens_per_s_cpu", "speedup_wall", "speedup_cpu"):
                assert row[key]["min"] <= row[key]["median"] <= row[key]["max"] and row[key]["min"] > 0
            assert row["tokens_per_target_call"] >= 1 and row["predicted_speedup"] > 0
        assert block["arms"]["generate sdpa"]["speedup_wall"]["median"] == 1.0


@pytest.mark.slow
def test_greedy_arms_match_generate(report):
    """Every greedy arm, the heads' chains and trees included, emits `generate`'s own tokens."""
    for arm, row in report["modes"]["greedy"]["arms"].items():
        assert row["matches_generate"] == "1/1", arm
    assert all("matches_generate" not in row for row in report["modes"]["T=0.7"]["arms"].values())


def test_prediction_is_chapter_6s_model():
    """S = E / (D + v): a chain pays K draft passes, a tree one per level, Medusa one in all."""
    costs = {"target_1": 10.0, "target_5": 15.0, "target_15": 20.0, "draft_1": 1.0, "draft_2": 1.5,
             "draft_4": 2.0, "eagle_1": 0.5, "eagle_2": 0.5, "eagle_4": 1.0, "medusa": 0.2}
    assert predicted_speedup(ARMS["draft chain K=4"], 3.0, costs) == {"D": 0.4, "v": 1.5, "S": round(3 / 1.9, 3)}
    assert predicted_speedup(ARMS["EAGLE tree (2,2,1,1)"], 3.0, costs)["D"] == 0.3  # levels 1, 2, 4, 4 rows
    assert predicted_speedup(ARMS["Medusa chain K=4"], 2.0, costs) == {"D": 0.02, "v": 1.5, "S": round(2 / 1.52, 3)}
    assert predicted_speedup(ARMS["generate sdpa"], 1.0, costs)["S"] == 1.0


def test_arms_without_a_generate_baseline_are_refused():
    """No baseline, no speedup: the arms must include a generate arm (and only known names)."""
    with pytest.raises(ValueError, match="arms"):
        run(arms=["EAGLE chain K=4"])
    with pytest.raises(ValueError, match="arms"):
        run(arms=["generate sdpa", "EAGLE tree (9,9)"])


@pytest.mark.slow
def test_fast_path_heads_read_the_prepared_target_and_stay_exact(tmp_path):
    """`--path fast`: the pair prepared (chapter 12), the heads in its dtype; three generate
    baselines; the heads' greedy output is the prepared target's own."""
    out = tmp_path / "fast.json"
    arms = ["generate sdpa", "generate eager", "generate float32", "draft chain K=4", "EAGLE chain K=4",
            "EAGLE tree (2,2,1,1)"]
    with torch_threads():
        main(["--path", "fast", "--prompts", "1", "--max-new-tokens", "8", "--rounds", "1", "--threads", "1",
              "--cost-repeats", "2", "--arms", *arms, "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["meta"]["path"] == "fast" and report["meta"]["dtype"] in ("bfloat16", "float32")
    for arm, row in report["modes"]["greedy"]["arms"].items():
        if not arm.startswith("generate"):
            assert row["matches_generate"] == "1/1", arm
    assert report["modes"]["greedy"]["fastest_generate"]["wall"] in arms[:3]


def test_float32_baseline_belongs_to_the_fast_path():
    """The as-loaded path has no third baseline, and refuses it by name; an unknown path or
    domain too."""
    with pytest.raises(ValueError, match="generate float32"):
        run(1, 4, 1, ["generate sdpa", "generate float32"])
    with pytest.raises(ValueError, match="path must be"):
        run(1, 4, 1, ["generate sdpa"], path="gpu")
    with pytest.raises(ValueError, match="domain must be"):
        run(1, 4, 1, ["generate sdpa"], domain="web")

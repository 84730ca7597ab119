"""The benchmark's tree arms (`bench.trees`): they run next to the chain, reproduce the
baseline's greedy tokens in bfloat16 with grouped attention, and their report section sets
each arm against the tree model."""

from __future__ import annotations

import pytest
import torch
from conftest import torch_threads

from specdec_ref.bench.run import main, parse_args
from specdec_ref.bench.trees import DEFAULT_TREES, parse_trees, tree_label, tree_nodes
from specdec_ref.fast.packed import packing_unsupported
from specdec_ref.trees.tree import ConfidentShape

PACKED = packing_unsupported(torch.nn.Linear(2, 2)) is None


def test_tree_shapes_parse_label_and_count():
    assert parse_trees("2,2,1,1; c4,4,4/3") == ((2, 2, 1, 1), ConfidentShape((4, 4, 4), top=3))
    assert [tree_label(s) for s in parse_trees("3,2,1;c4,4")] == ["3,2,1", "confident 4,4 top 4"]
    assert tree_nodes((3, 2, 1)) == 3 + 6 + 6 and tree_nodes(ConfidentShape((4, 4, 2))) == 10
    with pytest.raises(ValueError, match="tree shape"):
        parse_trees("2,x")
    with pytest.raises(SystemExit, match="--trees"):
        parse_args(["--trees", "c2,0"])
    assert parse_args(["--trees"])[0].trees == DEFAULT_TREES
    assert parse_args([])[0].trees == ()


@pytest.mark.skipif(not PACKED, reason="the run's grouped bfloat16 setting needs prepacking")
def test_tree_arms_run_beside_the_chain_and_report_the_model(tmp_path):
    """bfloat16, grouped eager attention, lean draft: tree arms give the baseline's greedy
    tokens; the report's tree section has each tree and lean chain arm, measured and predicted."""
    argv = ["--pair", "random", "--quick", "--max-new-tokens", "16", "--k-values", "3", "--threads", "1",
            "--modes", "greedy,t1.0", "--dtype", "bfloat16", "--attention", "grouped_eager",
            "--random-width", "64", "--random-vocab", "256", "--no-progress",
            "--trees", "2,2,1;c3,3,3/2", "--out", str(tmp_path / "bench.json")]
    with torch_threads():
        report = main(argv)
    assert report["greedy_identical"] is True
    assert report["meta"]["trees"] == ["2,2,1", "confident 3,3,3 top 2"]
    names = {arm["name"] for arm in report["arms"] if arm["mode"] == "greedy"}
    assert {"specdec_ref tree 2,2,1", "specdec_ref tree confident 3,3,3 top 2", "specdec_ref k=3 lean"} <= names
    for mode in ("greedy", "t1.0"):
        section = report["trees"][mode]
        rows = {row["shape"]: row for row in section["arms"]}
        assert set(rows) == {"chain k=3", "2,2,1", "confident 3,3,3 top 2"}
        assert section["reference"] == "specdec_ref tree 2,2,1"  # the most nodes
        assert rows["2,2,1"]["reference"] and rows["2,2,1"]["nodes"] <= 2 + 4 + 4
        assert rows["confident 3,3,3 top 2"]["nodes"] <= 9
        assert 0 <= section["rank_rates"][0] <= 1
        for row in rows.values():
            assert 1 <= row["tokens_per_pass"] <= row["depth"] + 1
            assert 1 <= row["predicted_tokens_per_pass"] <= row["depth"] + 1
            assert row["verify_cost"] > 0 and row["draft_cost_per_level"] > 0
            assert row["predicted_speedup"] > 0 and row["measured_speedup"] > 0
            assert 0 < row["draft_passes_per_iteration"] <= row["depth"]

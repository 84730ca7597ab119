"""The README snippet's path is measured by a script, and the README states what it measured."""

import json
import re
from pathlib import Path

import pytest
from conftest import needs_bf16_packing

from specdec_ref.bench import default_path
from specdec_ref.reports import read_report, report_names

ROOT = Path(__file__).resolve().parents[1]


@needs_bf16_packing
def test_a_short_run_times_every_arm_and_the_snippet_is_greedy_exact(tmp_path):
    out = tmp_path / "default-path.json"
    result = default_path.main(["--prompts", "1", "--max-new-tokens", "10", "--repeats", "1", "--threads", "1",
                                "--modes", "greedy", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    row = result["modes"]["greedy"]
    assert set(row["tokens_per_s"]) == {"snippet", "benchmark's best fixed-K arm", "generate, prepared target",
                                        "generate, prepared target, sdpa", "generate, float32 as loaded"}
    assert row["greedy_identical"] is True and row["baseline"].startswith("generate")
    assert row["speedup"][row["baseline"]] == 1.0 and row["snippet_over_best_arm"] > 0
    assert row["same_tokens_as_best_arm"] is True and row["snippet_over_best_arm_paired_median"] > 0
    meta = result["meta"]
    assert meta["num_draft_tokens"] == 4 and meta["benchmark_best_arm"] == "specdec_ref k=4 lean"
    assert meta["prompt_source"].endswith("seed 1") and meta["prepare"][0].startswith("specdec_ref.fast.prepare")


def test_the_best_fixed_k_arm_is_read_from_the_report():
    report = read_report("bench-tiny-cpu.json")
    best = default_path.best_fixed_k_arm(report)
    fixed = [arm for arm in report["arms"] if arm["mode"] == "greedy" and default_path.BEST_ARM.match(arm["name"])]
    assert best["speedup"] == max(arm["speedup"] for arm in fixed)
    with pytest.raises(ValueError, match="no fixed-K specdec_ref arm"):
        default_path.best_fixed_k_arm({"arms": []})


def readme_figures(report: dict) -> list[str]:
    """The figures the README's "Use it" section quotes from the report, as it rounds them."""
    greedy, sampled = report["modes"]["greedy"], report["modes"]["t0.7 top-k 50"]
    return [f"{greedy['speedup']['snippet']:.2f}x", f"{sampled['speedup']['snippet']:.2f}x",
            f"{greedy['snippet_over_best_arm']:.2f}", f"{sampled['snippet_over_best_arm']:.2f}",
            f"{report['meta']['threads']} threads", f"{report['meta']['max_new_tokens']} tokens"]


def test_the_readme_states_the_measured_speed_of_its_snippet():
    """Every figure of the README's sentence on the snippet's speed is the committed report's;
    a changed report fails this test (checked below on a copy)."""
    assert "default-path-tiny-cpu.json" in report_names()
    report = read_report("default-path-tiny-cpu.json")
    section = ROOT.joinpath("README.md").read_text().split("## Use it")[1].split("\n## ")[0]
    for figure in readme_figures(report):
        assert figure in section, figure
    assert report["modes"]["greedy"]["greedy_identical"] is True
    changed = json.loads(json.dumps(report))
    changed["modes"]["greedy"]["speedup"]["snippet"] += 0.05
    assert any(figure not in section for figure in readme_figures(changed))
    assert re.search(r"python -m specdec_ref\.bench\.default_path", section)


def test_the_readme_snippet_runs_as_written(capsys):
    """The "Use it" snippet, executed as the README writes it: the prepared path, exact length."""
    section = ROOT.joinpath("README.md").read_text().split("## Use it")[1]
    code = section.split("```python\n")[1].split("```")[0]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
    out, fast = namespace["out"], namespace["fast"]
    assert out.sequences.size(1) == namespace["input_ids"].size(1) + 64
    assert "specdec_ref.fast.prepare on cpu:" in capsys.readouterr().out
    assert out.stats.drafted_tokens > 0 and fast.target is fast.target_model

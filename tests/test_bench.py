"""Smoke test of `python -m specdec_ref.bench` on tiny random-init models, and its greedy check."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import needs_bf16_packing, torch_threads

from specdec_ref.bench.arms import Arm, RunRecord
from specdec_ref.bench.run import BASELINES, format_table, greedy_mismatches, main
from specdec_ref.fast.packed import packing_unsupported

MODES = ("greedy", "t1.0", "t0.7")
K_VALUES = (1, 3)
ARM_NAMES = {"hf generate", "hf assisted default", "hf assisted k=1", "hf assisted k=3", "specdec_ref autoregressive",
             "specdec_ref k=4 nocache", "specdec_ref k=1", "specdec_ref k=3", "specdec_ref heuristic",
             "specdec_ref model", "specdec_ref k=1 lean", "specdec_ref k=3 lean", "specdec_ref model lean"}
# On a CPU that can prepack, the run packs both models and also times generate without it.
PACKED = packing_unsupported(torch.nn.Linear(2, 2)) is None
if PACKED:
    ARM_NAMES |= {"hf generate plain"}
# A one-thread run on a CPU with two cores or more also times generate on two threads.
TWO_THREADS = (os.cpu_count() or 1) >= 2
if TWO_THREADS:
    ARM_NAMES |= {"hf generate 2 threads"}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One short benchmark run: its JSON report and what it printed."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    argv = ["--pair", "random", "--quick", "--max-new-tokens", "12", "--k-values", "1,3", "--threads", "1",
            "--random-target-layers", "2", "--random-width", "64", "--random-vocab", "256", "--no-progress",
            "--out", str(out)]
    with torch_threads():
        return main(argv), json.loads(out.read_text())


def test_bench_writes_the_report_it_returns(bench_run):
    """The JSON file holds the report, with the top-level keys and the pass costs the analysis reads."""
    returned, written = bench_run
    assert written == json.loads(json.dumps(returned))
    assert set(written) == {"meta", "cost_ratio", "lean_cost_ratio", "loop_cost_ratio", "lean_loop_cost_ratio",
                            "verify_cost", "baselines", "arms", "greedy_identical",
                            "greedy_mismatches", "headline", "fast_path", "trees"}
    assert written["fast_path"] is None and written["meta"]["fast"] is False  # on a CPU only when asked
    assert written["trees"] is None and written["meta"]["trees"] == []  # tree arms only when asked
    meta = written["meta"]
    for key in ("pair", "device", "dtype", "torch", "transformers", "date", "prompts", "max_new_tokens", "repeats",
                "threads"):
        assert key in meta, key
    assert meta["pair"] == "random" and meta["max_new_tokens"] == 12 and meta["threads"] == 1
    assert meta["linear"] == ("packed" if PACKED else "plain") and meta["attention"] == "sdpa"
    # What fast.prepare would choose for the pair as loaded: the README snippet's path.
    assert meta["prepare"][0] == "specdec_ref.fast.prepare on cpu:" and any("LeanForward" in line
                                                                         for line in meta["prepare"])
    assert written["cost_ratio"] > 0 and written["lean_cost_ratio"] > 0  # the random draft is Llama-style
    assert written["loop_cost_ratio"] > 0 and written["lean_loop_cost_ratio"] > 0
    assert set(written["verify_cost"]) == {str(k) for k in range(1, 9)}
    assert all(v > 0 for v in written["verify_cost"].values())


def test_bench_runs_every_arm_in_every_mode(bench_run):
    """Each mode has the baseline, assisted generation and every specdec_ref arm, with the right fields."""
    _, report = bench_run
    for mode in MODES:
        arms = {arm["name"]: arm for arm in report["arms"] if arm["mode"] == mode}
        assert set(arms) == ARM_NAMES
        # The baseline is the fastest target-only generate: speedup 1, and no other variant is faster.
        assert arms[report["baselines"][mode]]["speedup"] == pytest.approx(1.0)
        assert all(arms[name]["speedup"] <= 1 + 1e-12 for name in BASELINES if name in arms)
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
            # The passes each arm paid in its own loop: a draft pass only where it drafted.
            assert arm["target_pass_ms"] > 0 and arm["lean"] == arm["name"].endswith(" lean")
            assert (arm["draft_pass_ms"] is None) == (arm["draft_calls_per_token"] == 0)


def test_headline_names_the_fastest_speculative_arm_of_each_mode(bench_run):
    """The headline picks, per mode, the fastest cached specdec_ref arm and the fastest assisted arm."""
    _, report = bench_run
    for mode in MODES:
        best = report["headline"][mode]
        arms = {a["name"]: a for a in report["arms"] if a["mode"] == mode}
        ours = [a for a in arms.values() if a["impl"] == "specdec_ref" and a["schedule"] and a["use_cache"]]
        assert best["speedup"] == max(a["speedup"] for a in ours) == arms[best["best_arm"]]["speedup"]
        assert arms[best["best_assisted"]]["impl"] == "transformers"
        assert best["over_assisted"] == pytest.approx(best["speedup"] / best["assisted_speedup"])
        assert f"{mode}: fastest speculative arm {best['best_arm']}" in format_table(report)


def test_bench_greedy_arms_match_the_baseline(bench_run):
    """Greedy: every arm, transformers' and ours, produced the baseline's tokens, and the table says so."""
    _, report = bench_run
    assert report["greedy_identical"] is True
    assert report["greedy_mismatches"] == []
    table = format_table(report)
    assert "every arm produced the baseline's tokens on every prompt: yes" in table
    assert all(name in table for name in ARM_NAMES)


@needs_bf16_packing
@pytest.mark.skipif(not PACKED, reason="this torch build cannot prepack linear layers")
def test_bfloat16_grouped_run_times_every_baseline_variant_and_stays_greedy_exact(tmp_path):
    """bfloat16, prepacked, grouped eager attention: generate also plain, with sdpa, in float32
    and on two threads; the baseline is the fastest of them, and every greedy arm still gives
    generate's tokens."""
    argv = ["--pair", "random", "--quick", "--max-new-tokens", "12", "--k-values", "2", "--threads", "1",
            "--modes", "greedy", "--dtype", "bfloat16", "--attention", "grouped_eager",
            "--random-target-layers", "2",
            "--random-width", "64", "--random-vocab", "256", "--no-progress", "--no-lean",
            "--out", str(tmp_path / "bench.json")]
    with torch_threads():
        report = main(argv)
        assert torch.get_num_threads() == 1  # the variant's two threads were for its own runs
    meta = report["meta"]
    assert (meta["dtype"], meta["linear"], meta["attention"]) == ("bfloat16", "packed", "grouped_eager")
    variants = {"hf generate plain", "hf generate sdpa", "hf generate float32"}
    if TWO_THREADS:
        variants |= {"hf generate 2 threads"}
    assert set(meta["baseline_variants"]) == variants
    arms = {arm["name"]: arm for arm in report["arms"]}
    assert variants < set(arms)
    fastest = max((name for name in BASELINES if name in arms), key=lambda name: arms[name]["tokens_per_s"]["median"])
    assert report["baselines"]["greedy"] == fastest and arms[fastest]["speedup"] == pytest.approx(1.0)
    assert report["greedy_identical"] is True
    assert "over hf generate" in format_table(report)


def test_fast_arms_run_on_the_article_shapes_and_report_their_costs_and_predictions(tmp_path):
    """`--fast` on random GPT-2 models (small stand-ins for the article's shapes): the fast
    arms run, reproduce generate's greedy tokens, and the report gives both paths' step
    times, c, v(K), the bandwidth floor and the model's predictions at alpha 0.6-0.8."""
    argv = ["--pair", "gpt2-shapes-small", "--fast", "--modes", "greedy", "--k-values", "2",
            "--fast-k-values", "1,3", "--num-prompts", "1", "--repeats", "1", "--max-new-tokens", "10",
            "--threads", "1", "--no-progress", "--out", str(tmp_path / "bench.json")]
    with torch_threads():
        report = main(argv)
    names = {arm["name"] for arm in report["arms"]}
    assert {"specdec_ref autoregressive fast", "specdec_ref k=1 fast", "specdec_ref k=3 fast",
            "specdec_ref model fast"} <= names and "specdec_ref k=3" not in names
    assert report["greedy_identical"] is True
    fast = report["fast_path"]
    for path in ("fast", "eager"):
        costs = fast[path]
        assert costs["target_ms"] > 0 and costs["draft_ms"] > 0 and costs["cost_ratio"] > 0
        assert set(costs["verify_cost"]) == {str(k) for k in range(1, 9)}
        assert costs["target_over_floor"] == pytest.approx(costs["target_ms"] / fast["floor_ms"]["target"])
    assert fast["fast"]["cuda_graphs"] is False and fast["bandwidth_gb_s"] > 0
    predictions = fast["modes"]["greedy"]["predictions"]["fast"]
    assert set(predictions) == {"0.6", "0.7", "0.8"}
    assert all(1 <= row["k"] <= 8 and row["speedup_over_baseline"] > 0 for row in predictions.values())
    assert "fast path (static cache) against eager" in format_table(report)


def test_bench_runs_a_loaded_pair_as_it_is_and_gives_back_its_generation_configs():
    """`run_benchmark(config, models=...)` (chapter 6 on a GPU): the chapter's own models, not a second copy;
    nothing packed, EOS switched off only during the run; settings that would change the models are refused."""
    from specdec_ref.bench.pair import random_pair
    from specdec_ref.bench.run import BenchConfig, run_benchmark

    pair = random_pair()
    draft, target = pair.draft_model, pair.target_model
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = 3
    small = dict(pair="random", max_new_tokens=6, repeats=1, num_prompts=1, k_values=(2,), modes=("greedy",),
                 cost_repeats=1, progress=False, threads=1, lean=False)
    with pytest.raises(ValueError, match="linear='plain'"):
        run_benchmark(BenchConfig(**small), models=(draft, target, None))
    with torch_threads():
        report = run_benchmark(BenchConfig(**small, linear="plain", fast=False, compiled=False),
                               models=(draft, target, None))
    assert report["greedy_identical"] is True and report["meta"]["linear"] == "plain"
    assert report["meta"]["compiled_generate_error"] is None and report["fast_path"] is None
    assert target.generation_config.eos_token_id == draft.generation_config.eos_token_id == 3
    assert any(isinstance(m, torch.nn.Linear) for m in target.modules())


def test_greedy_check_reports_a_mismatch():
    """The greedy check flags an arm whose tokens differ from the baseline's, at the first differing position."""
    baseline = Arm("hf generate", "transformers", "greedy", None, True, None)
    ours = Arm("specdec_ref k=2", "specdec_ref", "greedy", 2, True, "fixed")
    sampled = Arm("specdec_ref k=2", "specdec_ref", "t1.0", 2, True, "fixed")

    def record(tokens):
        return RunRecord(tokens, 1.0, 0.5, len(tokens), 0, None, None)

    # A baseline variant computes in another configuration (here float32): its tokens are not compared.
    variant = Arm("hf generate float32", "transformers", "greedy", None, True, None, variant="float32")
    records = {baseline: [(0, 0, record([5, 6, 7]))], ours: [(0, 0, record([5, 6, 7])), (1, 0, record([5, 9, 7]))],
               sampled: [(0, 0, record([1, 2, 3]))], variant: [(0, 0, record([5, 8, 7]))]}
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


def _recording(monkeypatch, target):
    """Log every speculative call ("s") and every `generate` call ("b", with its kwargs) in order."""
    from specdec_ref.bench import methods

    calls, original_generate, original_speculative = [], target.generate, methods.speculative_generate

    def speculative(*args, **kwargs):
        calls.append(("s", kwargs))
        return original_speculative(*args, **kwargs)

    def generate(*args, **kwargs):
        calls.append(("b", kwargs))
        return original_generate(*args, **kwargs)

    monkeypatch.setattr(methods, "speculative_generate", speculative)
    monkeypatch.setattr(target, "generate", generate)
    return calls


def test_article_timing_runs_speculative_first_and_generate_at_its_defaults(monkeypatch):
    """The article's protocol: one speculative call, then one generate(do_sample=True) with no top_k (so 50)."""
    from conftest import make_model

    from specdec_ref.bench.methods import article_timing

    target, draft = make_model("gpt2", layers=2, seed=1), make_model("gpt2", layers=1, seed=2)
    calls = _recording(monkeypatch, target)
    result = article_timing(target, draft, torch.tensor([[2, 3, 4]]), max_new_tokens=10, num_draft_tokens=3)
    assert [name for name, _ in calls] == ["s", "b"]
    assert calls[0][1]["num_draft_tokens"] == 3 and calls[0][1]["sampling"].temperature == 1.0
    baseline = calls[1][1]
    assert baseline["do_sample"] is True and "top_k" not in baseline and "generation_config" not in baseline
    assert result.speculative_tokens == 10 and 1 <= result.baseline_tokens <= 10
    assert result.speculative_s > 0 and result.baseline_s > 0
    assert result.speedup == pytest.approx(result.baseline_s / result.speculative_s)


def test_fair_timing_warms_up_alternates_and_spells_out_the_sampling(monkeypatch):
    """Warm-up of each, then alternating order; the baseline samples with no top-k and EOS off."""
    from conftest import make_model

    from specdec_ref.bench.methods import fair_timing

    target, draft = make_model("llama", layers=2, seed=1), make_model("llama", layers=1, seed=2)
    target.generation_config.eos_token_id = 1  # fair_timing must switch it off, without touching the model
    calls = _recording(monkeypatch, target)
    result = fair_timing(target, draft, torch.tensor([[2, 3, 4]]), max_new_tokens=8, repeats=3, warmup=1)
    assert "".join(name for name, _ in calls) == "sb" + "sb" + "bs" + "sb"
    config = calls[1][1]["generation_config"]
    assert (config.do_sample, config.top_k, config.top_p, config.eos_token_id) == (True, 0, 1.0, None)
    assert target.generation_config.eos_token_id == 1
    assert len(result.speculative.samples) == len(result.baseline.samples) == 3
    assert result.speedup == pytest.approx(result.baseline.median / result.speculative.median)
    assert len(result.repeat_speedups) == 3 and all(s > 0 for s in result.repeat_speedups)
    with pytest.raises(ValueError, match="repeats"):
        fair_timing(target, draft, torch.tensor([[2, 3]]), repeats=0)


def test_methods_command_prints_the_article_timing_as_json(capsys):
    """`python -m specdec_ref.bench.methods` loads the pair, runs the protocol once and prints one JSON line."""
    from specdec_ref.bench.methods import main

    with torch_threads():
        returned = main(["--pair", "tiny", "--max-new-tokens", "6", "--threads", "1", "--device", "cpu"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(returned))
    assert printed["speculative_tokens"] == 6 and printed["pair"] == "tiny" and printed["device"] == "cpu"
    assert printed["speedup"] == pytest.approx(printed["baseline_s"] / printed["speculative_s"])


def test_sized_target_has_the_asked_shape_and_vocabulary():
    """layers x width with 64-dim heads and the draft's vocabulary; a width off the head grid is refused."""
    from specdec_ref.bench.scale import sized_target

    model = sized_target(2, 128, vocab=48)
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.num_attention_heads) == (2, 128, 2)
    assert model.get_output_embeddings().weight.shape == (48, 128)
    assert not model.training
    with pytest.raises(ValueError, match="width"):
        sized_target(2, 100, vocab=48)


def test_size_sweep_measures_c_and_v_for_every_target(tmp_path):
    """One point per given target and per shape, each with its own tau_q: v(0) = 1, c = tau_q / tau_p; JSON."""
    from conftest import make_model

    from specdec_ref.bench.scale import load_sweep, size_sweep, sweep_report

    draft, target = make_model("llama", layers=1, seed=2), make_model("llama", layers=2, seed=1)
    with torch.no_grad():
        points = size_sweep(draft, [(2, 64), (3, 128)], targets={"own": target}, max_k=3, repeats=2)
    assert [p.name for p in points] == ["own", "2 x 64", "3 x 128"]
    assert all(p.draft_step_s > 0 and p.target_step_s > 0 for p in points)
    for point in points:
        assert sorted(point.verify_cost) == [0, 1, 2, 3] and point.verify_cost[0] == 1.0
        assert point.cost_ratio == pytest.approx(point.draft_step_s / point.target_step_s)
    assert points[2].parameters > points[1].parameters
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep_report(points, device=torch.device("cpu"), dtype=torch.float32, context=64)))
    meta, loaded = load_sweep(path)
    assert meta["device"] == "cpu" and meta["dtype"] == "float32" and loaded == points


def test_scale_command_writes_the_sweep(tmp_path, capsys):
    """`python -m specdec_ref.bench.scale` times the pair's own target and the asked shapes."""
    from specdec_ref.bench.scale import main

    out = tmp_path / "sweep.json"
    with torch_threads():
        report = main(["--pair", "tiny", "--device", "cpu", "--threads", "1", "--shapes", "1x64", "--repeats", "1",
                       "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert [p["name"] for p in report["points"]] == ["the tiny target", "1 x 64"]
    assert "c " in capsys.readouterr().out


@pytest.mark.skipif(not PACKED, reason="this torch build cannot prepack linear layers")
def test_scale_command_prepacks_every_model_when_asked(tmp_path, monkeypatch):
    """`--linear packed`: the draft, the pair's target and every random target run prepacked."""
    from specdec_ref.bench import scale
    from specdec_ref.fast.packed import is_packed

    timed = []
    measure = scale.measure_size
    monkeypatch.setattr(scale, "measure_size", lambda draft, target, **kw: timed.append(
        (is_packed(draft), is_packed(target))) or measure(draft, target, **kw))
    with torch_threads():
        report = scale.main(["--pair", "tiny", "--device", "cpu", "--threads", "1", "--shapes", "1x64",
                             "--repeats", "1", "--linear", "packed", "--out", str(tmp_path / "sweep.json")])
    assert timed == [(True, True), (True, True)] and report["meta"]["linear"] == "packed"


def test_a_paused_meter_counts_nothing_and_then_counts_again():
    """`ForwardMeter.paused` takes the hooks off for a block (compiled generate runs so) and
    puts them back after it; a compiled arm's summary has no overhead share to report."""
    from conftest import make_model

    from specdec_ref.bench.meter import ForwardMeter
    from specdec_ref.bench.summary import summarize

    model = make_model("gpt2", layers=1, seed=0)
    meter = ForwardMeter({"target": model}, torch.device("cpu"))
    ids = torch.tensor([[1, 2, 3]])
    with meter.paused():
        model(ids)
    assert meter.calls["target"] == 0
    model(ids)
    assert meter.calls["target"] == 1 and meter.seconds["target"] > 0
    meter.remove()
    arm = Arm("hf generate compiled", "transformers", "greedy", None, True, None, variant="compiled")
    record = RunRecord([1, 2], 0.5, 0.0, 0, 0, None, None)
    assert summarize(arm, [(0, 0, record)])["overhead_share"] is None

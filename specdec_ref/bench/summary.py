"""The benchmark's report, arm by arm: medians, ratios, the headline, and the greedy check.

`summarize` turns the runs of one arm into its report entry (tokens/s with quartiles,
alpha, tokens per target pass, time outside the forward passes, in-loop pass times);
`greedy_mismatches` compares every greedy arm's tokens with the baseline's, prompt by
prompt; `headline` picks each mode's fastest speculative arm and sets it against
`generate`, assisted generation and the performance model; `make_report` puts them
together as the report of one run (`run`: build, run the arms, report).
"""

from __future__ import annotations

import datetime
import os
import platform

import torch
import transformers

from ..timing import Timing
from .arms import VARIANTS, Arm, RunRecord, assisted_defaults
from .config import BenchConfig, BenchSetup
from .fast import fast_section
from .report import predicted_vs_measured
from .trees import tree_label, tree_section

BASELINE = "hf generate"
# The baseline of each mode: the fastest of target-only `generate` with the models as run and
# its variants (`arms.VARIANTS`): the baseline's fastest configuration.
BASELINES = (BASELINE, *(f"{BASELINE} {variant}" for variant in VARIANTS), "specdec_ref autoregressive fast")


def make_report(config: BenchConfig, setup: BenchSetup,
                 records: dict[Arm, list[tuple[int, int, RunRecord]]]) -> dict:
    """The report of one run (the JSON `run_benchmark` returns): every arm's summary
    and speedup over its mode's baseline, the measured costs, and the headline."""
    summaries = [summarize(arm, records[arm]) for arm in setup.arms]
    baselines = {mode: max((s for s in summaries if s["mode"] == mode and s["name"] in BASELINES),
                           key=lambda s: s["tokens_per_s"]["median"]) for mode in config.modes}
    for summary in summaries:
        summary["speedup"] = (summary["tokens_per_s"]["median"]
                              / baselines[summary["mode"]]["tokens_per_s"]["median"])
    mismatches = greedy_mismatches(records)
    report_baselines = {mode: summary["name"] for mode, summary in baselines.items()}
    costs, fast = setup.costs, setup.fast
    report = {
        "meta": _meta(config, setup),
        "cost_ratio": costs.cost_ratio,
        "lean_cost_ratio": costs.lean_cost_ratio,
        "loop_cost_ratio": costs.loop_cost_ratio,
        "lean_loop_cost_ratio": costs.lean_loop_cost_ratio,
        "verify_cost": {str(k): v for k, v in costs.verify_cost.items()},
        "baselines": report_baselines,
        "arms": summaries,
        "greedy_identical": (not mismatches) if "greedy" in config.modes else None,
        "greedy_mismatches": mismatches,
        "fast_path": (fast_section(setup.fast_costs, summaries, report_baselines, max_k=max(setup.fast_k))
                      if fast else None),
        "trees": tree_section(setup.arms, records, summaries, report_baselines) if config.trees else None,
    }
    report["headline"] = headline(report)
    return report


def _meta(config: BenchConfig, setup: BenchSetup) -> dict:
    """The report's `meta`: what ran, where, with which versions and settings."""
    pair, device, prompts, costs = setup.pair, setup.device, setup.prompts, setup.costs
    return {
        "pair": pair.name, "requested_pair": config.pair, "pair_description": pair.description,
        "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "dtype": config.dtype, "linear": setup.linear,
        "attention": pair.target_model.config._attn_implementation,
        "baseline_variants": {f"{BASELINE} {v}": VARIANTS[v] for v in setup.variants},
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "date": datetime.datetime.now().astimezone().isoformat(),
        "prompts": len(prompts), "prompt_source": setup.prompt_source,
        "prompt_lengths": [int(p.size(1)) for p in prompts], "max_new_tokens": config.max_new_tokens,
        "repeats": config.repeats, "threads": torch.get_num_threads(), "k_values": list(config.k_values),
        "onednn_kernel_cache": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
        "modes": list(config.modes), "seed": config.seed, "cost_context": costs.context,
        "target_pass_ms": 1000 * costs.target_seconds,
        "overhead_method": "forward hooks on both models (GPU synchronized at each pass boundary)",
        "hf_assisted_defaults": assisted_defaults(), "fast": setup.fast,
        "compiled_generate_error": setup.compile_error,
        # transformers' assisted arms that crashed (dropped from "arms"): the finding, not a dead run
        "peer_crashes": setup.peer_crashes,
        "prepare": setup.prepared, "trees": [tree_label(shape) for shape in config.trees],
    }


def headline(report: dict) -> dict:
    """Per mode: the fastest speculative arm, its speedup over `generate` and over assisted
    generation at its best K (None where every assisted arm crashed: `meta.peer_crashes`), its
    share of time outside the forward passes, and what the performance model predicts for it
    (fixed-K arms; None for a schedule)."""
    predicted = {(row.name, row.mode): row.predicted_speedup for row in predicted_vs_measured(report)}
    out = {}
    for mode in report["meta"]["modes"]:
        arms = [arm for arm in report["arms"] if arm["mode"] == mode and arm["schedule"] is not None]
        ours = max((a for a in arms if a["impl"] == "specdec_ref" and a["use_cache"]), key=lambda a: a["speedup"])
        assisted = max((a for a in arms if a["impl"] == "transformers"), key=lambda a: a["speedup"], default=None)
        out[mode] = {"best_arm": ours["name"], "speedup": ours["speedup"], "baseline": report["baselines"][mode],
                     "best_assisted": assisted and assisted["name"],
                     "assisted_speedup": assisted and assisted["speedup"],
                     "over_assisted": assisted and ours["speedup"] / assisted["speedup"],
                     "overhead_share": ours["overhead_share"],
                     "predicted_speedup": predicted.get((ours["name"], mode))}
    return out


def summarize(arm: Arm, runs: list[tuple[int, int, RunRecord]]) -> dict:
    """The report entry of one arm: medians over repetitions, ratios over all runs."""
    by_repeat: dict[int, list[RunRecord]] = {}
    for repeat, _, record in runs:
        by_repeat.setdefault(repeat, []).append(record)
    rates, overheads = [], []
    for group in by_repeat.values():
        wall = sum(r.wall_seconds for r in group)
        rates.append(sum(len(r.tokens) for r in group) / wall)
        overheads.append(1 - sum(r.forward_seconds for r in group) / wall)
    records = [record for _, _, record in runs]
    tokens = sum(len(r.tokens) for r in records)
    target_calls = sum(r.target_calls for r in records)
    drafted = sum(r.drafted or 0 for r in records)
    accepted = sum(r.accepted or 0 for r in records)
    judged = sum(r.judged or 0 for r in records)
    iterations = sum(r.iterations for r in records)
    return {
        "name": arm.name, "impl": arm.impl, "mode": arm.mode, "k": arm.k, "use_cache": arm.use_cache,
        "schedule": arm.schedule, "tokens_per_s": Timing(tuple(rates)).as_dict(), "speedup": None,
        # The acceptance rate: accepted / drafted (comparable across implementations).
        "alpha": accepted / drafted if arm.speculative and drafted else None,
        # Per-token acceptance, accepted / judged drafts: the alpha of the performance model.
        "alpha_per_token": accepted / judged if judged else None,
        "block_efficiency": tokens / target_calls if target_calls else None,
        "target_calls_per_token": target_calls / tokens if tokens else None,
        # None where the passes ran unmetered (compiled generate: `meter.ForwardMeter.paused`).
        "overhead_share": None if arm.variant == "compiled" else Timing(tuple(overheads)).median,
        "mean_k": drafted / iterations if arm.speculative and iterations else None,
        "draft_calls_per_token": sum(r.draft_calls for r in records) / tokens if tokens else None,
        "lean": arm.lean, "fast": arm.fast,
        # Mean pass times inside the loop (the draft's pass runs right after the target's, whose
        # weights have just streamed through the CPU caches): the c and v(K) the arm really paid.
        "target_pass_ms": _mean_ms(sum(r.target_seconds for r in records), target_calls),
        "draft_pass_ms": _mean_ms(sum(r.draft_seconds for r in records),
                                  sum(r.draft_calls for r in records)),
    }


def _mean_ms(seconds: float, calls: int) -> float | None:
    return 1000 * seconds / calls if calls else None


def greedy_mismatches(records: dict[Arm, list[tuple[int, int, RunRecord]]]) -> list[dict]:
    """Greedy runs whose tokens differ from the baseline's on the same prompt."""
    reference = {}
    for arm, runs in records.items():
        if arm.mode == "greedy" and arm.name == BASELINE:
            reference = {index: record.tokens for _, index, record in runs}
    mismatches = []
    for arm, runs in records.items():
        # A baseline variant computes in another configuration, so its rounding may differ.
        if arm.mode != "greedy" or arm.variant is not None:
            continue
        for repeat, index, record in runs:
            expected = reference[index]
            if record.tokens != expected:
                first = next(i for i, (a, b) in enumerate(zip(record.tokens, expected, strict=True)) if a != b)
                mismatches.append({"arm": arm.name, "prompt": index, "repeat": repeat, "first_difference": first})
    return mismatches

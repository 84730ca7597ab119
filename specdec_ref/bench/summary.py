"""The benchmark's report, arm by arm: medians, ratios, the headline, and the greedy check.

`summarize` turns the runs of one arm into its report entry (tokens/s with quartiles,
alpha, tokens per target pass, time outside the forward passes, in-loop pass times);
`greedy_mismatches` compares every greedy arm's tokens with the baseline's, prompt by
prompt; `headline` picks each mode's fastest speculative arm and sets it against
`generate`, assisted generation and the performance model.
"""

from __future__ import annotations

from ..timing import Timing
from .arms import Arm, RunRecord
from .report import predicted_vs_measured

BASELINE = "hf generate"


def headline(report: dict) -> dict:
    """Per mode: the fastest speculative arm, its speedup over `generate` and over assisted
    generation at its best K, its share of time outside the forward passes, and what the
    performance model predicts for it (fixed-K arms; None for a schedule)."""
    predicted = {(row.name, row.mode): row.predicted_speedup for row in predicted_vs_measured(report)}
    out = {}
    for mode in report["meta"]["modes"]:
        arms = [arm for arm in report["arms"] if arm["mode"] == mode and arm["schedule"] is not None]
        ours = max((a for a in arms if a["impl"] == "specdec_ref" and a["use_cache"]), key=lambda a: a["speedup"])
        assisted = max((a for a in arms if a["impl"] == "transformers"), key=lambda a: a["speedup"])
        out[mode] = {"best_arm": ours["name"], "speedup": ours["speedup"], "baseline": report["baselines"][mode],
                     "best_assisted": assisted["name"],
                     "assisted_speedup": assisted["speedup"], "over_assisted": ours["speedup"] / assisted["speedup"],
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

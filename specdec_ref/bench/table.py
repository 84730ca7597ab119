"""The benchmark report as a plain-text table (`python -m specdec_ref.bench` prints it)."""

from __future__ import annotations

import math

from .arms import MODES


def format_table(report: dict) -> str:
    """The report as a plain-text table, one block per mode."""
    meta = report["meta"]
    lines = [f"pair: {meta['pair_description']}"]
    if meta.get("pair_note"):  # reports written before the tiny pair always shipped
        lines.append(f"NOTE: {meta['pair_note']}")
    verify = " ".join(f"{k}:{v:.2f}" for k, v in report["verify_cost"].items())
    lines += [
        f"device {meta['device']} ({meta['dtype']}, {meta['threads']} threads, "
        f"{meta.get('linear', 'plain')} linear layers, {meta.get('attention', 'sdpa')} attention), "
        f"torch {meta['torch']}, "
        f"transformers {meta['transformers']}",
        f"{meta['prompts']} prompts ({meta['prompt_source']}), {meta['max_new_tokens']} new tokens, "
        f"{meta['repeats']} repeats; target 1-token pass {meta['target_pass_ms']:.2f} ms at context "
        f"{meta['cost_context']}",
        f"cost ratio c = {report['cost_ratio']:.3f}"
        + (f" (lean draft: {report['lean_cost_ratio']:.3f})" if report.get("lean_cost_ratio") else "")
        + f"; verification cost v(K): {verify}",
    ]
    if report.get("loop_cost_ratio"):
        lean = report.get("lean_loop_cost_ratio")
        lines.append(f"c after a target pass, as in the loop = {report['loop_cost_ratio']:.3f}"
                     + (f" (lean draft: {lean:.3f})" if lean else ""))
    if meta.get("hf_assisted_defaults"):
        defaults = meta["hf_assisted_defaults"]
        adapts = "adaptive" if defaults["threshold_adapts"] else "fixed: no scikit-learn"
        lines.append(f"hf assisted default = {defaults['num_assistant_tokens']} tokens, "
                     f"{defaults['num_assistant_tokens_schedule']} schedule, confidence threshold "
                     f"{defaults['assistant_confidence_threshold']} ({adapts}); "
                     "hf assisted k=K: K tokens, constant, no threshold")
    header = (f"{'arm':<33} {'tok/s':>8} {'[q1, q3]':>17} {'speedup':>7} {'alpha':>6} {'a/tok':>6} {'tok/call':>8} "
              f"{'calls/tok':>9} {'mean K':>6} {'overhead':>8}")
    for mode in meta["modes"]:
        lines += ["", f"mode {mode}: {MODES[mode]}", header, "-" * len(header)]
        for arm in (a for a in report["arms"] if a["mode"] == mode):
            tps = arm["tokens_per_s"]
            spread = f"[{tps['q1']:.1f}, {tps['q3']:.1f}]"
            lines.append(
                f"{arm['name']:<33} {tps['median']:>8.1f} {spread:>17} "
                f"{arm['speedup']:>6.2f}x {_fmt(arm['alpha'], 6, '.2f')} {_fmt(arm['alpha_per_token'], 6, '.2f')} "
                f"{_fmt(arm['block_efficiency'], 8, '.2f')} "
                f"{_fmt(arm['target_calls_per_token'], 9, '.2f')} {_fmt(arm['mean_k'], 6, '.1f')} "
                f"{_fmt(arm['overhead_share'], 8, '.1%')}")
    for mode, best in report.get("headline", {}).items():
        model = best["predicted_speedup"]
        baseline = best.get("baseline", "hf generate")  # reports before the plain baseline lack the key
        assisted = (f"{best['over_assisted']:.2f}x over {best['best_assisted']} ({best['assisted_speedup']:.2f}x)"
                    if best.get("best_assisted") else "no assisted arm ran")
        lines += ["", f"{mode}: fastest speculative arm {best['best_arm']}: {best['speedup']:.2f}x over {baseline}, "
                  f"{assisted}, "
                  f"{best['overhead_share']:.1%} outside the forward passes"
                  + (f", model {model:.2f}x" if model is not None and not math.isnan(model) else "")]
    for crash in meta.get("peer_crashes") or ():
        lines += ["", f"transformers {crash['transformers']}: arm {crash['arm']} ({crash['mode']}) crashed: "
                  f"{crash['error']}"]
    if report.get("fast_path"):
        lines += ["", *fast_path_lines(report["fast_path"])]
    if report["greedy_identical"] is not None:
        verdict = "yes" if report["greedy_identical"] else f"NO, {len(report['greedy_mismatches'])} mismatches"
        lines += ["", f"greedy: every arm produced the baseline's tokens on every prompt: {verdict}"]
    lines.append("alpha = accepted / drafted; a/tok = accepted / judged drafts (the model's per-token alpha)")
    return "\n".join(lines)


def fast_path_lines(fast: dict) -> list[str]:
    """The fast path's costs against the eager path's and the bandwidth floor, and the model's predictions."""
    lines = [f"fast path (static cache{', CUDA graphs' if fast['fast']['cuda_graphs'] else ''}) against eager: "
             f"bandwidth {fast['bandwidth_gb_s']:.0f} GB/s, weight floors target {fast['floor_ms']['target']:.3f} ms, "
             f"draft {fast['floor_ms']['draft']:.3f} ms"]
    for path in ("fast", "eager"):
        costs = fast[path]
        lines.append(f"  {path:<5} target {costs['target_ms']:.3f} ms ({costs['target_over_floor']:.1f}x its floor), "
                     f"draft {costs['draft_ms']:.3f} ms, c = {costs['cost_ratio']:.3f}, v(K): "
                     + " ".join(f"{k}:{v:.2f}" for k, v in costs["verify_cost"].items()))
    for mode, row in fast["modes"].items():
        predicted = ", ".join(
            f"alpha {alpha}: {p['speedup_over_baseline']:.2f}x (K = {p['k']})"
            for alpha, p in row["predictions"]["fast"].items() if "speedup_over_baseline" in p)
        lines.append(f"  {mode}: model over {row['baseline']}: {predicted}")
    return lines


def _fmt(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"

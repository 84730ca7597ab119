"""Reading a benchmark report: each arm's measured speedup next to what the model predicts.

`python -m specdec_ref.bench` writes a JSON report (`run.run_benchmark`); chapter 6
reads the committed one. For every cached, fixed-K `specdec_ref` arm,
`predicted_vs_measured` computes the performance model's speedup (`analysis`:
E[tokens] / (K c + v(K))) from the arm's measured per-token alpha and the costs the
arm paid: c of its own draft forward (plain, lean, or the fast path's) timed as in
the loop where the report has that, and v(K) of the path its target ran on. The
model counts in steps of the target as the arm ran it; where the report's baseline
is another configuration (a faster `generate`), the prediction is scaled by that
configuration's measured ratio, so prediction and measurement share one baseline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..analysis import expected_tokens, iteration_cost

# The target-only arm that runs each path as the speculative arms of that path do.
TARGET_ALONE = {False: "hf generate", True: "specdec_ref autoregressive fast"}


@dataclass(frozen=True)
class SpeedupRow:
    """One benchmark arm: the speedup the model predicts, and the measured."""

    name: str  # the arm's name in the benchmark
    mode: str  # "greedy", "t1.0", ...
    k: int  # drafts per iteration
    alpha: float  # measured per-token acceptance of the arm
    predicted_tokens: float  # (1 - alpha^(K+1)) / (1 - alpha)
    block_efficiency: float  # measured tokens per target call (nan if absent)
    # E[tokens] / (K * c + v(K)) (nan without v(K) or alpha)
    predicted_speedup: float
    # measured block efficiency / (K * c + v(K)): the cost model alone
    cost_model_speedup: float
    measured_speedup: float  # tokens/s of the arm / tokens/s of the baseline
    lean: bool = False  # the draft ran through `lean.LeanForward`
    fast: bool = False  # both models ran through `fast.StaticForward`


def load_benchmark(path: str | Path) -> dict:
    """Read the JSON report written by `python -m specdec_ref.bench`."""
    return json.loads(Path(path).read_text())


def _as_report(benchmark: Mapping | str | Path) -> Mapping:
    return benchmark if isinstance(benchmark, Mapping) else load_benchmark(benchmark)


def predicted_vs_measured(benchmark: Mapping | str | Path) -> list[SpeedupRow]:
    """Predicted and measured speedups of the cached, fixed-K specdec_ref arms.

    Uses the measured v(K) of the arm's path and the c the arm paid
    (`arm_cost_ratio`); arms without an alpha, or whose K has no measured
    verification cost, get a nan prediction. Two predictions separate the
    two halves of the model: `predicted_speedup` starts from alpha,
    `cost_model_speedup` from the tokens per target call measured.
    """
    data = _as_report(benchmark)
    # The target alone on each path, over the baseline: 1 unless the
    # baseline is another configuration.
    as_run = {(arm["mode"], fast): _number(arm.get("speedup"))
              for arm in data["arms"]
              for fast, name in TARGET_ALONE.items() if arm["name"] == name}
    rows = []
    for arm in data["arms"]:
        if arm["impl"] != "specdec_ref" or not _is_cached_fixed_k(arm):
            continue
        k, fast = arm["k"], bool(arm.get("fast"))
        costs = arm_verify_cost(data, arm)
        # The model's alpha is the per-token acceptance (accepted / judged
        # drafts); accepted / drafted undercounts it, since drafts after a
        # rejection are never judged.
        alpha = _number(arm.get("alpha_per_token"))
        efficiency = _number(arm.get("block_efficiency"))
        tokens = (expected_tokens(alpha, k) if not math.isnan(alpha)
                  else float("nan"))
        cost = (iteration_cost(k, arm_cost_ratio(data, arm), costs)
                if k in costs else float("nan"))
        scale = as_run.get((arm["mode"], fast), 1.0)
        rows.append(SpeedupRow(
            arm["name"], arm["mode"], k, alpha, tokens, efficiency,
            scale * tokens / cost, scale * efficiency / cost,
            _number(arm.get("speedup")), bool(arm.get("lean")), fast))
    return rows


def arm_verify_cost(benchmark: Mapping, arm: Mapping) -> dict[int, float]:
    """{K: v(K)} of the path the arm's target ran on (the fast path's, or the models')."""
    costs = benchmark["verify_cost"]
    if arm.get("fast") and benchmark.get("fast_path"):
        costs = benchmark["fast_path"]["fast"]["verify_cost"]
    return {int(key): float(value) for key, value in costs.items()}


def arm_cost_ratio(benchmark: Mapping, arm: Mapping) -> float:
    """The c an arm of a report paid: its draft's (fast, lean or plain), timed right
    after a target pass as in the loop where the report has that.

    A draft pass timed alone finds its weights in the CPU's caches; in the loop the
    target's pass has just evicted them.
    """
    if arm.get("fast") and benchmark.get("fast_path"):
        return float(benchmark["fast_path"]["fast"]["cost_ratio"])
    keys = ("lean_loop_cost_ratio", "lean_cost_ratio") if arm.get("lean") else ("loop_cost_ratio", "cost_ratio")
    found = [benchmark[key] for key in keys if benchmark.get(key) is not None]
    return float(found[0] if found else benchmark["cost_ratio"])


def speedup_by_k(benchmark: Mapping | str | Path, *, mode: str, impl: str, lean: bool = False,
                 fast: bool = False) -> dict[int, float]:
    """{K: measured speedup} of one implementation's fixed-K cached arms.

    Args:
        benchmark: the report, or the path of its JSON file.
        mode: the benchmark mode, e.g. "greedy" or "t1.0".
        impl: "specdec_ref" or "transformers" (assisted generation).
        lean: the arms whose draft ran through `lean.LeanForward` instead.
        fast: the arms whose models ran through `fast.StaticForward` instead.

    Returns:
        The arms' speedups over the mode's baseline, sorted by K.
    """
    data = _as_report(benchmark)
    found = {arm["k"]: _number(arm.get("speedup")) for arm in data["arms"]
             if arm["mode"] == mode and arm["impl"] == impl and _is_cached_fixed_k(arm)
             and bool(arm.get("lean")) == lean and bool(arm.get("fast")) == fast}
    return dict(sorted(found.items()))


def _number(value: object) -> float:
    """A report field as a float; None (JSON null) becomes nan."""
    return float(value) if value is not None else float("nan")


def _is_cached_fixed_k(arm: Mapping) -> bool:
    """Whether an arm drafted a fixed K with both caches (not a schedule, not the uncached arm)."""
    return arm["use_cache"] and arm["schedule"] == "fixed" and isinstance(arm["k"], int)

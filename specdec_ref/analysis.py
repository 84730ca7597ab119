"""The performance model of speculative decoding: what speedup to expect.

Leviathan et al. (2023) model each drafted token as accepted independently with
probability alpha, the expectation over contexts of
beta = sum_x min(p(x), q(x)). An iteration drafts K tokens, stops at the first
rejection, and always emits one more token (the correction, or the bonus token
after K acceptances), so

    E[tokens per iteration] = 1 + alpha + ... + alpha^K
                            = (1 - alpha^(K+1)) / (1 - alpha)

(K + 1 when alpha = 1). In units of one target decoding step, an iteration
costs K draft steps of relative cost c plus one target pass over K + 1 tokens,
whose relative cost v(K) is about 1 while decoding is memory-bound but must be
measured:

    speedup = E[tokens] / (K * c + v(K))

This module is the one implementation of these formulas (performance chapter):
the adaptive draft length (`schedules.ModelBasedDraftLength`) and the notebooks
call it. Alongside: a Monte Carlo check of the closed forms, the acceptance
rate the model implies, and predicted against measured speedups from the
benchmark's JSON report. alpha itself is measured on a real pair by
`acceptance`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# How a verification cost v(K) may be given: None (v = 1), a callable
# K -> v(K), a mapping {K: v(K)} (keys int or str, as in the benchmark JSON)
# or a sequence indexed by K.
VerifyCost = Callable[[int], float] | Mapping | Sequence[float] | None


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per iteration: (1 - alpha^(K+1)) / (1 - alpha).

    This is the block efficiency the model predicts: tokens per target pass.
    """
    _check_alpha(alpha)
    _check_k("k", k, minimum=0)
    if 1 - alpha < 1e-6:
        # Near alpha = 1 the closed form divides two tiny numbers; the finite
        # sum is exact (K + 1 at 1).
        return math.fsum(alpha**i for i in range(k + 1))
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_acceptance_rate(alpha: float, k: int) -> float:
    """Expected accepted / drafted: (E[tokens] - 1) / K, lower than alpha.

    Every iteration drafts K tokens; on average E[tokens] - 1 of them are
    accepted (the last token of a block is the correction or bonus, never a
    draft). Drafts after the first rejection count as drafted but are never
    judged, so this ratio falls as K grows while alpha stays the same.
    """
    _check_k("k", k, minimum=1)
    return (expected_tokens(alpha, k) - 1) / k


def accepted_count_distribution(alpha: float, k: int) -> list[float]:
    """P(N = n) for n = 0..K drafts accepted: alpha^n (1 - alpha), alpha^K."""
    _check_alpha(alpha)
    _check_k("k", k, minimum=0)
    return [alpha**n * (1 - alpha) for n in range(k)] + [alpha**k]


def as_verify_cost(verify_cost: VerifyCost) -> Callable[[int], float]:
    """Turn any accepted form of v(K) into a function of K (v(0) = 1).

    Raises:
        ValueError: when a table has no entry for a K that is asked for.
    """
    if verify_cost is None:
        return lambda k: 1.0
    if callable(verify_cost):
        return lambda k: 1.0 if k == 0 else float(verify_cost(k))
    if isinstance(verify_cost, Mapping):
        table = {int(key): float(value) for key, value in verify_cost.items()}
    elif isinstance(verify_cost, Sequence) and not isinstance(verify_cost, str):
        table = {k: float(value) for k, value in enumerate(verify_cost)}
    else:
        raise ValueError("verify_cost must be None, a callable, a mapping or "
                         f"a sequence, got {verify_cost!r}")
    table.setdefault(0, 1.0)

    def lookup(k: int) -> float:
        if k not in table:
            raise ValueError(f"verify_cost has no entry for K={k} (it covers "
                             f"K in {sorted(table)}); measure it or lower "
                             "max_k")
        return table[k]

    return lookup


def verify_cost_from_latency(num_tokens: Sequence[int],
                             seconds: Sequence[float]) -> dict[int, float]:
    """The table {K: v(K)} from timed passes over m = K + 1 new tokens.

    Args:
        num_tokens: the pass sizes m, which must include 1 (a decoding step),
            e.g. `measure.LatencyCurve.num_tokens`.
        seconds: the time of each pass, e.g. `LatencyCurve.median_s`.

    Returns:
        {m - 1: seconds(m) / seconds(1)} for every m, so v(0) = 1.

    Raises:
        ValueError: without a 1-token pass, on mismatched lengths, or on a
            time that is not positive.
    """
    sizes, times = list(num_tokens), [float(s) for s in seconds]
    if len(sizes) != len(times):
        raise ValueError(f"num_tokens ({len(sizes)} sizes) and seconds "
                         f"({len(times)} times) must have the same length")
    if 1 not in sizes:
        raise ValueError(f"num_tokens must include 1, got {sizes!r}")
    if not all(t > 0 for t in times):
        raise ValueError(f"seconds must all be > 0, got {times!r}")
    step = times[sizes.index(1)]  # tau_p: one decoding step
    return {m - 1: t / step for m, t in zip(sizes, times, strict=True)}


def iteration_cost(k: int, cost_ratio: float,
                   verify_cost: VerifyCost = None) -> float:
    """Time of one iteration in target decoding steps: K * c + v(K)."""
    _check_k("k", k, minimum=0)
    _check_cost_ratio(cost_ratio)
    return k * cost_ratio + as_verify_cost(verify_cost)(k)


def expected_speedup(alpha: float, k: int, cost_ratio: float,
                     verify_cost: VerifyCost = None) -> float:
    """Expected speedup over target-only decoding: E[tokens] / (K c + v(K)).

    Args:
        alpha: probability that a drafted token is accepted, in [0, 1].
        k: tokens drafted per iteration (0 is plain decoding: speedup 1).
        cost_ratio: c, time of a draft decoding step / a target step.
        verify_cost: v(K), time of a target pass over K + 1 tokens / a
            1-token pass (default 1: verification as cheap as one step).
    """
    cost = iteration_cost(k, cost_ratio, verify_cost)
    return expected_tokens(alpha, k) / cost


def optimal_draft_length(alpha: float, cost_ratio: float, *, max_k: int,
                         min_k: int = 1,
                         verify_cost: VerifyCost = None) -> int:
    """The K in [min_k, max_k] with the largest expected speedup.

    Ties go to the smallest such K.
    """
    _check_k("min_k", min_k, minimum=1)
    _check_k("max_k", max_k, minimum=min_k)
    cost = as_verify_cost(verify_cost)
    speedups = {k: expected_speedup(alpha, k, cost_ratio, cost)
                for k in range(min_k, max_k + 1)}
    return max(speedups, key=lambda k: (speedups[k], -k))


def alpha_from_block_efficiency(block_efficiency: float, k: int) -> float:
    """The alpha whose E[tokens] at this K equals a measured block efficiency.

    The inverse of `expected_tokens` in alpha.

    Raises:
        ValueError: unless 1 <= block_efficiency <= K + 1, the range E[tokens]
            can take.
    """
    _check_k("k", k, minimum=1)
    if not 1 <= block_efficiency <= k + 1:
        raise ValueError(f"block_efficiency must lie in [1, K + 1] = "
                         f"[1, {k + 1}], got {block_efficiency!r}")
    # E[tokens] increases strictly with alpha on [0, 1]: bisect to float
    # precision.
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if expected_tokens(middle, k) < block_efficiency:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True)
class SimulationResult:
    """Monte Carlo iterations of the independent-acceptance model."""

    # drafts accepted in each simulated iteration, shape (num_iterations,)
    accepted: torch.Tensor

    @property
    def mean_tokens(self) -> float:
        """Tokens per iteration: accepted drafts plus the correction/bonus."""
        return float(self.accepted.double().mean()) + 1

    @property
    def standard_error(self) -> float:
        """Standard error of `mean_tokens`."""
        n = self.accepted.numel()
        return float(self.accepted.double().std() / math.sqrt(n))

    def frequencies(self, k: int) -> list[float]:
        """Observed fraction of iterations with n = 0..K accepted drafts."""
        counts = torch.bincount(self.accepted, minlength=k + 1).double()
        return (counts / self.accepted.numel()).tolist()


def simulate_acceptance(alpha: float, k: int, *, num_iterations: int,
                        generator: torch.Generator) -> SimulationResult:
    """Draw iterations: K Bernoulli(alpha) tests, stopped at a rejection."""
    _check_alpha(alpha)
    _check_k("k", k, minimum=0)
    _check_k("num_iterations", num_iterations, minimum=1)
    uniforms = torch.rand(num_iterations, k, generator=generator)
    tests = uniforms < alpha  # (N, K)
    # The accepted prefix: a draft counts only if it and every draft before
    # it passed.
    accepted = tests.long().cumprod(dim=1).sum(dim=1)  # (N,)
    return SimulationResult(accepted)


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


def load_benchmark(path: str | Path) -> dict:
    """Read the JSON report written by `python -m specdec_ref.bench`."""
    return json.loads(Path(path).read_text())


def predicted_vs_measured(benchmark: Mapping | str | Path) -> list[SpeedupRow]:
    """Predicted and measured speedups of the cached, fixed-K specdec_ref arms.

    Uses the report's measured `verify_cost` table and the c each arm pays
    (`arm_cost_ratio`); arms without an alpha, or whose K has no measured
    verification cost, get a nan prediction. Two predictions separate the
    two halves of the model: `predicted_speedup` starts from alpha,
    `cost_model_speedup` from the tokens per target call actually measured.
    Both count in steps of the target as the run configured it; where the
    report's baseline is another configuration of `generate` (a faster
    one), they are scaled by that configuration's measured ratio.
    """
    data = (benchmark if isinstance(benchmark, Mapping)
            else load_benchmark(benchmark))
    costs = {int(key): float(value)
             for key, value in (data.get("verify_cost") or {}).items()}
    # generate as run, over the baseline: 1 unless the baseline is a variant.
    as_run = {arm.get("mode"): _number(arm.get("speedup"))
              for arm in data.get("arms", [])
              if arm.get("name") == "hf generate"}
    rows = []
    for arm in data.get("arms", []):
        if (arm.get("impl") != "specdec_ref"
                or not isinstance(arm.get("k"), int)
                or not _is_cached_fixed_k(arm)):
            continue
        k = arm["k"]
        # The model's alpha is the per-token acceptance (accepted / judged
        # drafts); accepted / drafted undercounts it, since drafts after a
        # rejection are never judged.
        per_token = arm.get("alpha_per_token")
        alpha = _number(per_token if per_token is not None
                        else arm.get("alpha"))
        efficiency = _number(arm.get("block_efficiency"))
        measured = _number(arm.get("speedup"))
        tokens = (expected_tokens(alpha, k) if not math.isnan(alpha)
                  else float("nan"))
        cost = (iteration_cost(k, arm_cost_ratio(data, arm), costs)
                if k in costs else float("nan"))
        scale = as_run.get(arm.get("mode"), 1.0)
        rows.append(SpeedupRow(str(arm.get("name", "")),
                               str(arm.get("mode", "")), k, alpha, tokens,
                               efficiency, scale * tokens / cost,
                               scale * efficiency / cost, measured,
                               is_lean_arm(arm)))
    return rows


def arm_cost_ratio(benchmark: Mapping, arm: Mapping) -> float:
    """The c an arm of a report paid: its draft's (lean or not), timed
    right after a target pass as in the loop where the report has that.

    A draft pass timed alone finds its weights in the CPU's caches; in the
    loop the target's pass has just evicted them.
    """
    keys = (("lean_loop_cost_ratio", "lean_cost_ratio") if is_lean_arm(arm)
            else ("loop_cost_ratio", "cost_ratio"))
    found = [benchmark[key] for key in keys if benchmark.get(key) is not None]
    return float(found[0] if found else benchmark["cost_ratio"])


def is_lean_arm(arm: Mapping) -> bool:
    """Whether a report's arm drafted through `lean.LeanForward`."""
    return bool(arm.get("lean")) or str(arm.get("name", "")).endswith(" lean")


def speedup_by_k(benchmark: Mapping | str | Path, *, mode: str,
                 impl: str, lean: bool = False) -> dict[int, float]:
    """{K: measured speedup} of one implementation's fixed-K cached arms.

    Args:
        benchmark: the report, or the path of its JSON file.
        mode: the benchmark mode, e.g. "greedy" or "t1.0".
        impl: "specdec_ref" or "transformers" (assisted generation).
        lean: the arms whose draft ran through `lean.LeanForward` instead.

    Returns:
        The arms' speedups over the mode's baseline, sorted by K.
    """
    data = (benchmark if isinstance(benchmark, Mapping)
            else load_benchmark(benchmark))
    found = {arm["k"]: _number(arm.get("speedup"))
             for arm in data.get("arms", [])
             if arm.get("mode") == mode and arm.get("impl") == impl
             and isinstance(arm.get("k"), int) and _is_cached_fixed_k(arm)
             and is_lean_arm(arm) == lean}
    return dict(sorted(found.items()))


def _number(value: object) -> float:
    """A report field as a float; None (JSON null) becomes nan."""
    return float(value) if value is not None else float("nan")


def _is_cached_fixed_k(arm: Mapping) -> bool:
    """False for adaptive-schedule arms and arms run without a KV cache."""
    for key in ("use_cache", "cache", "cached", "kv_cache"):
        if key in arm and arm[key] is False:
            return False
    if str(arm.get("schedule", "fixed")).lower() not in ("fixed", "none"):
        return False
    name = str(arm.get("name", "")).lower().replace("-", "").replace("_", "")
    return "nocache" not in name and "uncached" not in name


def _check_alpha(alpha: object) -> None:
    if (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
            or not 0 <= alpha <= 1):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")


def _check_cost_ratio(cost_ratio: object) -> None:
    if (isinstance(cost_ratio, bool)
            or not isinstance(cost_ratio, (int, float))
            or not cost_ratio >= 0):
        raise ValueError(f"cost_ratio must be a number >= 0, "
                         f"got {cost_ratio!r}")


def _check_k(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, "
                         f"got {value!r}")

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
call it. Alongside: a Monte Carlo check of the closed forms and the acceptance
rate the model implies; `bench.report` sets its predictions against the
benchmark's measurements. alpha itself is measured on a real pair by
`acceptance`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .validation import check_integer

# How a verification cost v(K) may be given: None (v = 1), a callable
# K -> v(K), a mapping {K: v(K)} (keys int or str, as in the benchmark JSON)
# or a sequence indexed by K.
VerifyCost = Callable[[int], float] | Mapping | Sequence[float] | None



def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per iteration: (1 - alpha^(K+1)) / (1 - alpha).

    This is the block efficiency the model predicts: tokens per target pass.
    """
    _check_alpha(alpha)
    check_integer("k", k, minimum=0)
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
    check_integer("k", k, minimum=1)
    return (expected_tokens(alpha, k) - 1) / k


def accepted_count_distribution(alpha: float, k: int) -> list[float]:
    """P(N = n) for n = 0..K drafts accepted: alpha^n (1 - alpha), alpha^K."""
    _check_alpha(alpha)
    check_integer("k", k, minimum=0)
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
    check_integer("k", k, minimum=0)
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
    check_integer("min_k", min_k, minimum=1)
    check_integer("max_k", max_k, minimum=min_k)
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
    check_integer("k", k, minimum=1)
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
    check_integer("k", k, minimum=0)
    check_integer("num_iterations", num_iterations, minimum=1)
    uniforms = torch.rand(num_iterations, k, generator=generator)
    tests = uniforms < alpha  # (N, K)
    # The accepted prefix: a draft counts only if it and every draft before
    # it passed.
    accepted = tests.long().cumprod(dim=1).sum(dim=1)  # (N,)
    return SimulationResult(accepted)


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


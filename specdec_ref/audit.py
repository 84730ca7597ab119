"""Audit a decoder for exactness: do its first tokens follow the target's law? (chapter 11)

A speculative decoder is exact when what it emits is distributed as the target's
own sampling would be. `audit` checks this for any generate-like callable
`(input_ids, generator) -> sequences` (a tensor (1, n + new), or an object with
`.sequences`): it samples the first `num_tokens` emitted tokens many times and
compares their empirical law with the exact one by Pearson's chi-square test and
by total-variation distance (TV), stating how large a departure the test would
catch (its power). The exact law comes from enumeration (`specdec_ref.laws`, whose
names stay importable from here): `target_law` for the target's own sampling, or
for an implementation's own conventions (`generate_reference`), on a small vocabulary.

Two ways an audit of the first tokens misleads, and what `audit` does about them.
Many decoders draw their first token from a plain target pass (the prefill), so an
audit of one token never sees the rule, the bonus token, the cache's rollback or
EOS: `audit` refuses num_tokens = 1 unless the caller says the first token is
drafted and judged (`first_token_speculative=True`); with num_tokens = m > K the
outcome spans a block boundary and a bonus token (K = 1 over 2 tokens, K = 2 over 3).
And a decoder that crashes fails: the result says "crashed: <error>", it does not
raise. `specdec_ref.audit_tokens` audits every emitted token, at any vocabulary.

Invariant: an exact decoder fails the audit with probability at most `level`
(the test's size, in the chi-square approximation), and a decoder whose law is
at least `detectable_tv` from the exact one over the test's cells fails with
probability at least `power`.

The statistics are computed with torch (no scipy): the chi-square tail is the
regularized upper incomplete gamma function, and the power is the tail of a
noncentral chi-square, a Poisson mixture of central ones. A law p1 at TV e from
p0 has noncentrality n * sum (p1 - p0)^2 / p0 >= 4 n e^2 (Cauchy-Schwarz), so the
power against every such law is at least the power at 4 n e^2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .laws import GenerateFn, Law, decoder_law, law_tv, small_random_pair, target_law, transformers_assisted
from .validation import check_integer

# The exact laws moved to `specdec_ref.laws`; their names stay importable from here.
random_pair = small_random_pair
__all__ = ["AuditResult", "GenerateCrashed", "Law", "audit", "compare_counts", "decoder_law", "detectable_tv",
           "law_tv", "random_pair", "sample_emissions", "small_random_pair", "target_law", "transformers_assisted"]


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square with `df` degrees of freedom."""
    if x <= 0:
        return 1.0
    a, z = torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(a, z))


def _chi2_critical(level: float, df: int) -> float:
    """The x with P(X > x) = level, by bisection."""
    low, high = 0.0, float(df)
    while chi2_sf(high, df) > level:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_sf(mid, df) > level else (low, mid)
    return high


def _noncentral_power(critical: float, df: int, noncentrality: float) -> float:
    """P(X > critical) for X ~ noncentral chi-square(df, noncentrality)."""
    half = noncentrality / 2
    total, j, weight_sum = 0.0, 0, 0.0
    while weight_sum < 1 - 1e-12 and j < 100_000:
        # Poisson(half) weight of the j-th term, in logs for large `half`.
        weight = math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) if half > 0 else float(j == 0)
        total += weight * chi2_sf(critical, df + 2 * j)
        weight_sum += weight
        j += 1
    return total


def detectable_tv(num_samples: int, num_cells: int, *, level: float = 1e-3, power: float = 0.9) -> float:
    """The smallest TV the chi-square test catches with probability >= `power`.

    Args:
        num_samples: n, the samples the test sees.
        num_cells: k >= 2, the cells of the test (df = k - 1).
        level: the test's size (false-alarm probability for an exact decoder).
        power: the required probability of catching a departure.

    Returns:
        e = sqrt(lambda / (4 n)), where lambda is the noncentrality at which the
        test's power reaches `power`: every law at TV >= e over the cells has
        noncentrality >= 4 n e^2 >= lambda.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples!r}")
    if num_cells < 2:
        raise ValueError(f"num_cells must be >= 2, got {num_cells!r}")
    df = num_cells - 1
    critical = _chi2_critical(level, df)
    low, high = 0.0, 1.0
    while _noncentral_power(critical, df, high) < power:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _noncentral_power(critical, df, mid) < power else (low, mid)
    return math.sqrt(high / (4 * num_samples))


@dataclass(frozen=True)
class AuditResult:
    """The outcome of one exactness audit."""

    num_samples: int  # decoder calls sampled
    num_cells: int  # chi-square cells (outcomes rarer than min_expected pooled)
    statistic: float  # Pearson's chi-square statistic
    p_value: float  # P(chi-square >= statistic) for an exact decoder
    level: float  # the test fails when p_value < level
    power: float  # probability of catching a departure of detectable_tv
    detectable_tv: float  # smallest TV over the cells caught with that power
    tv_estimate: float  # TV between the empirical and the exact law, over the cells
    tv_noise: float  # an exact decoder's tv_estimate stays below this w.p. 1 - level
    impossible: int  # samples the exact law gives probability 0 (any one fails)
    error: str | None = None  # the audited callable's crash, "<type>: <message>" (fails)

    @property
    def passed(self) -> bool:
        """True when the sample is consistent with the exact law at `level`."""
        return self.error is None and self.impossible == 0 and self.p_value >= self.level

    @property
    def tv_lower_bound(self) -> float:
        """The decoder's true TV from the exact law is at least this, w.p. 1 - level."""
        return max(0.0, self.tv_estimate - self.tv_noise)

    def summary(self) -> str:
        """One line of at most 80 characters: verdict, TV bound, detectable TV."""
        verdict = "PASS" if self.passed else "FAIL"
        if self.error is not None:
            return f"FAIL: crashed: {self.error}"[:80]
        if self.passed:
            return (f"{verdict}: consistent with the exact law (n = {self.num_samples}, "
                    f"would catch TV >= {_round_up(self.detectable_tv)})")
        return (f"{verdict}: TV from the exact law >= {_round_down(self.tv_lower_bound)} "
                f"(n = {self.num_samples}, p < {self.level:g})")


def _round_up(x: float) -> str:
    """x rounded up to two significant digits (a bound stays a bound)."""
    if x <= 0:
        return "0"
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return f"{math.ceil(x / scale - 1e-9) * scale:.2g}"


def _round_down(x: float) -> str:
    """x rounded down to two significant digits."""
    if x <= 0:
        return "0"
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return f"{math.floor(x / scale + 1e-9) * scale:.2g}"


class GenerateCrashed(RuntimeError):
    """The audited callable raised (or emitted too few tokens): a verdict, not a bug of the audit."""


def crashed(error: BaseException, *, num_samples: int = 0, level: float = 1e-3, power: float = 0.9) -> AuditResult:
    """The failing result of an audit whose callable crashed with `error`."""
    cause = error.__cause__ if isinstance(error, GenerateCrashed) and error.__cause__ else error
    return AuditResult(num_samples=num_samples, num_cells=0, statistic=math.nan, p_value=0.0, level=level,
                       power=power, detectable_tv=math.nan, tv_estimate=math.nan, tv_noise=math.nan,
                       impossible=0, error=f"{type(cause).__name__}: {cause}")


def call_generate(generate: GenerateFn, input_ids: torch.Tensor, generator: torch.Generator | None) -> object:
    """`generate(input_ids, generator)`, its exceptions raised as `GenerateCrashed`."""
    try:
        return generate(input_ids, generator)
    except Exception as error:
        raise GenerateCrashed(str(error)) from error


def as_sequences(result: object) -> torch.Tensor:
    """The (1, n + new) ids of a generate-like result: a tensor or `.sequences`."""
    sequences = getattr(result, "sequences", result)
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2:
        raise TypeError("generate must return a (1, n + new) tensor or an object with .sequences, "
                        f"got {type(result).__name__}")
    return sequences


def sample_emissions(generate: GenerateFn, input_ids: torch.Tensor, *, num_samples: int, num_tokens: int = 1,
                     generator: torch.Generator | None = None) -> dict[tuple[int, ...], int]:
    """Call `generate` `num_samples` times and count its first `num_tokens` new tokens.

    Args:
        generate: `(input_ids, generator) -> sequences`, e.g. a lambda around
            `speculative_generate`; it must emit at least `num_tokens` tokens.
        input_ids: the prompt, shape (1, n).
        num_samples: how many calls (>= 1).
        num_tokens: how many emitted tokens form one outcome (>= 1).
        generator: passed to every call (seed it for a reproducible audit).

    Returns:
        {first num_tokens emitted tokens: count}.

    Raises:
        GenerateCrashed: if a call raised or emitted fewer than `num_tokens` tokens.
    """
    check_integer("num_tokens", num_tokens, minimum=1)
    if not callable(generate):
        raise TypeError(f"generate must be callable (input_ids, generator) -> sequences, got {generate!r}")
    n = input_ids.size(1)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(num_samples):
        new = as_sequences(call_generate(generate, input_ids, generator))[0, n:]
        if new.numel() < num_tokens:
            raise GenerateCrashed(f"generate emitted {new.numel()} tokens, fewer than num_tokens = {num_tokens}")
        outcome = tuple(new[:num_tokens].tolist())
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def compare_counts(counts: Mapping[tuple[int, ...], int], law: Mapping[tuple[int, ...], float], *,
                   level: float = 1e-3, power: float = 0.9, min_expected: float = 5.0) -> AuditResult:
    """Chi-square and TV comparison of observed counts with an exact law.

    Outcomes whose expected count is below `min_expected` are pooled into one
    cell (merged into the smallest cell if the pool itself is too small), as the
    chi-square approximation needs.

    Args:
        counts: {outcome: count}, as `sample_emissions` returns.
        law: {outcome: probability}, summing to 1 (`target_law`, `decoder_law`).
        level: the test's size, in (0, 1).
        power: the power at which `detectable_tv` is stated, in (0, 1).
        min_expected: the smallest expected count of a cell.

    Returns:
        An `AuditResult`.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    total_mass = sum(law.values())
    if not law or abs(total_mass - 1) > 1e-6 or min(law.values()) < 0:
        raise ValueError(f"law must map outcomes to probabilities >= 0 summing to 1, got a total of {total_mass!r}")
    n = sum(counts.values())
    if n < 1:
        raise ValueError("counts must hold at least one sample")
    impossible = sum(c for outcome, c in counts.items() if law.get(outcome, 0.0) <= 0)
    # Cells: every outcome expected at least min_expected times, then the pool.
    kept = sorted((o for o, prob in law.items() if prob * n >= min_expected), key=lambda o: -law[o])
    cells = [([o], law[o], counts.get(o, 0)) for o in kept]
    kept_set = set(kept)
    pool_mass = sum(prob for o, prob in law.items() if o not in kept_set)
    pool_count = sum(c for o, c in counts.items() if o not in kept_set and law.get(o, 0.0) > 0)
    if pool_mass > 0:
        if pool_mass * n >= min_expected or not cells:
            cells.append(([], pool_mass, pool_count))
        else:
            outcomes, mass, count = cells.pop()
            cells.append((outcomes, mass + pool_mass, count + pool_count))
    if len(cells) < 2:
        raise ValueError(f"the law leaves fewer than 2 cells with {n} samples: sample more or pick "
                         "a context where more than one outcome is likely")
    expected = torch.tensor([mass for _, mass, _ in cells], dtype=torch.float64)  # (k,)
    observed = torch.tensor([count for _, _, count in cells], dtype=torch.float64)  # (k,)
    statistic = float(((observed - n * expected) ** 2 / (n * expected)).sum())
    k = len(cells)
    p_value = chi2_sf(statistic, k - 1)
    # Bretagnolle-Huber-Carol: P(||empirical - law||_1 >= e) <= 2^k exp(-n e^2 / 2).
    noise = 0.5 * math.sqrt(2 * (k * math.log(2) + math.log(1 / level)) / n)
    # TV over the cells, the impossible samples forming one more cell of law 0.
    tv = 0.5 * (float((observed / n - expected).abs().sum()) + impossible / n)
    return AuditResult(
        num_samples=n, num_cells=k, statistic=statistic, p_value=p_value, level=level, power=power,
        detectable_tv=detectable_tv(n, k, level=level, power=power), tv_estimate=min(tv, 1.0),
        tv_noise=noise, impossible=impossible,
    )


def audit(
    generate: GenerateFn,
    input_ids: torch.Tensor,
    law: Mapping[tuple[int, ...], float],
    *,
    num_samples: int,
    num_tokens: int = 1,
    generator: torch.Generator | None = None,
    level: float = 1e-3,
    power: float = 0.9,
    first_token_speculative: bool = False,
) -> AuditResult:
    """Test whether `generate`'s first `num_tokens` tokens follow `law`.

    Args:
        generate: any `(input_ids, generator) -> sequences` callable.
        input_ids: the prompt, shape (1, n).
        law: the exact law of the first `num_tokens` tokens, e.g.
            `target_law(target_model, input_ids, sampling, num_tokens)`.
        num_samples: decoder calls to sample (more calls, smaller
            detectable TV).
        num_tokens: length of one outcome; the keys of `law` have this length.
            Use num_tokens > K so that the outcome spans a bonus token and a
            block boundary.
        generator: the randomness passed to every call.
        level: the probability that an exact decoder fails (the test's size).
        power: the power at which the result states `detectable_tv`.
        first_token_speculative: required for num_tokens = 1: True says that
            `generate`'s first token is drafted and judged by the rule (as in
            `speculative_generate`), not sampled from a plain target pass.

    Returns:
        An `AuditResult`; `.passed` and `.summary()` give the verdict. A crash
        of `generate` is a failing result whose summary says "crashed: ...".

    Raises:
        ValueError: if the outcomes of `law` are not `num_tokens` long,
            num_tokens = 1 without `first_token_speculative`, or another
            argument is out of range (named in the message).
    """
    check_integer("num_samples", num_samples, minimum=1)
    if num_tokens == 1 and not first_token_speculative:
        raise ValueError(
            "num_tokens = 1 audits only the first token, which many decoders "
            "sample from a plain target pass (the prefill), so the rule is "
            "never seen: audit num_tokens >= 2 tokens (more than K), or pass "
            "first_token_speculative=True if generate's first token is "
            "drafted and judged")
    lengths = {len(outcome) for outcome in law}
    if lengths != {num_tokens}:
        raise ValueError(f"law's outcomes must all have num_tokens = "
                         f"{num_tokens} tokens, got lengths {lengths}")
    # Sample the decoder: counts of its first num_tokens emitted tokens.
    try:
        counts = sample_emissions(generate, input_ids, num_samples=num_samples,
                                  num_tokens=num_tokens, generator=generator)
    except GenerateCrashed as error:
        return crashed(error, level=level, power=power)
    # Compare them with the exact law: chi-square, TV and the stated power.
    return compare_counts(counts, law, level=level, power=power)

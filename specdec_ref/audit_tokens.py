"""Audit every emitted token for exactness, at any vocabulary (chapter 11).

`audit` enumerates the law of the first m tokens, so V ** m must stay small: on a real
vocabulary it sees one token, often the one a plain target pass samples, and never
the rule's later slots, the bonus token, the cache's rollback or EOS. This audit
sees every token of every run, through the randomized probability integral transform
(PIT; Brockwell 2007, Czado, Gneiting and Held 2009). For the token y_t emitted after
the prefix c_t, with p = p(. | c_t) the target's processed distribution (one target
pass over each finished sequence gives every position):

    u_t = F(y_t-) + U_t * p(y_t),     U_t ~ Uniform(0, 1) from `generator`,

where F(y-) is the mass of the tokens ranked before y. Invariant: if every y_t
follows p(. | c_t), whatever the past, then u_1, u_2, ... are independent
Uniform(0, 1) (the Rosenblatt transform), whatever the vocabulary, the decoder's
blocks or the prompt, and whatever fixed ranking of the tokens F uses.

The ranking decides what the test sees, so it uses two, each on the same U.
By decreasing p (ties by id): the usual errors of the law land in the same
place at every context (too much mass on likely tokens puts too many u near
0, whichever tokens are likely there), instead of cancelling out. By token id:
the errors of an implementation that walks the vocabulary in id order, as an
inverse CDF over `cumsum` does (a residual drawn with the uniform that rejected
the draft, which is not uniform any more, leans to high ids at every context;
ranked by p those ids scatter and the error cancels: that decoder, at a
first-token TV of 0.083, passes 8 seeds of 8 ranked by p alone, and fails
8 of 8 in both rankings, at the size recommended below).

Uniformity is tested, in each ranking, on all u pooled, by Kolmogorov-Smirnov
and by Pearson's chi-square on equal bins (`audit.compare_counts`), a quarter
of the ranking's level each, and, so that an error at one place is not
diluted, by chi-square in strata: each emitted position t and, when the result
has a `.trace` of blocks (`speculative_generate`'s), each offset in the block
(0: a block's first token, K: the bonus), the other half of the level split
evenly. Each ranking gets half of `level` (a weighted Bonferroni bound: an
exact decoder fails with probability at most `level`).

The power it states is the pooled chi-square's, ranked by p: `detectable_tv`,
the smallest TV between the binned law of the pooled u and the uniform law
that it catches with probability `power`. That is a distance between laws of
binned u, not between the decoder's tokens and p: the binned u are a function
of the token and of U, so their TV is at most the tokens' (per context), and
it can be far smaller, as errors that move mass within a bin, or in opposite
directions at different contexts, cancel. A PASS bounds what the binned u
show, not the decoder's TV. Tokens the target cannot emit (p = 0, after an
EOS, beyond `max_new_tokens`) and runs that stop early without an EOS count
as `impossible`, and fail the audit.

Recommended size: num_runs >= 32 and at least 2,000 tokens, e.g. 32 runs of 64
tokens (about 20 s on the tiny pair on one idle CPU thread); the pooled test then
catches a binned-u TV of about 0.07. At that size it flags, on a random 64-token
pair (tests/test_audit_tokens.py, p < 1e-4 each): a residual drawn from p instead
of max(0, p - q); p tempered (T = 0.5) while the rule is given q at T = 1; the
bonus drawn from p_{K-1}; a cache fed the whole prefix again; a residual drawn
by inverse CDF in id order with the rejecting uniform. False alarms of an exact
decoder at that size, over 200 seeds (`FALSE_ALARMS`): none at level 1e-3 (0.2
expected), 2 at 0.01, 10 at 0.05 (10 expected); the smallest p-value was 0.007.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .audit import (
    AuditResult,
    GenerateCrashed,
    _round_up,
    as_sequences,
    call_generate,
    chi2_sf,
    compare_counts,
    crashed,
)
from .laws import GenerateFn, Reference, reference_probs
from .validation import check_integer, eos_set

# False alarms measured on an exact decoder: `speculative_generate` (K = 2) on
# small_random_pair(64, seed=4, init_range=0.2), 32 runs of 64 tokens, seeds 1000-1199,
# both rankings (tests/test_audit_tokens.py, slow): seeds, and the seeds failing at each level.
FALSE_ALARMS = {"seeds": 200, "at 1e-3": 0, "at 0.01": 2, "at 0.05": 10, "at 0.1": 17}
ORDERS = ("probability", "id")  # the rankings of F; "both" audits in each
MAX_BINS = 10  # bins of a stratum: n // PER_BIN, at most MAX_BINS
PER_BIN = 10  # expected u per bin, at least (the chi-square approximation)


@dataclass(frozen=True)
class TokenAuditResult(AuditResult):
    """An `AuditResult` over every emitted token: num_samples counts tokens, p_value is
    the strata's Bonferroni-adjusted one, the TV fields are the worst stratum's."""

    num_runs: int = 0  # decoder calls
    worst: str = ""  # the stratum with the smallest adjusted p-value, e.g. "offset 2"
    strata: tuple[tuple[str, int, float], ...] = ()  # (stratum, tokens, adjusted p-value)
    pits: torch.Tensor | None = field(default=None, compare=False, repr=False)  # every u, (N,)

    def summary(self) -> str:
        """One line of at most 80 characters: verdict, where it failed, the power
        (a TV of the binned u, not of the tokens: see the module)."""
        if self.error is not None:
            return super().summary()
        if self.passed:
            return (f"PASS: u uniform (n = {self.num_samples}, would catch a TV of the binned u "
                    f">= {_round_up(self.detectable_tv)})")
        if self.impossible:
            return f"FAIL: {self.impossible} tokens the target cannot emit (n = {self.num_samples})"[:80]
        return (f"FAIL at {self.worst}: u not uniform, p = {self.p_value:.0e} "
                f"(n = {self.num_samples})")[:80]


@torch.no_grad()
def token_pits(target_model: PreTrainedModel, sequence: torch.Tensor, prompt_length: int, sampling: Reference,
               generator: torch.Generator | None = None, *, order: str = "probability") -> torch.Tensor:
    """The randomized PIT of every token after the prompt, from one target pass.

    Args:
        target_model: a causal LM (or any callable whose output has `.logits`).
        sequence: prompt + emitted tokens, shape (1, n + T), T >= 1.
        prompt_length: n >= 1.
        sampling: the reference processing (`SamplingConfig` or logits -> probs).
        generator: draws the U_t.
        order: "probability" (rank tokens by decreasing p), "id" (by token id),
            or "both" (each, with the same U_t).

    Returns:
        u, shape (T,), float64, or (2, T) for "both" (ranked by p, then by id);
        NaN where p(y_t) = 0 (the target cannot emit y_t).
    """
    if order not in (*ORDERS, "both"):
        raise ValueError(f"order must be 'probability', 'id' or 'both', got {order!r}")
    n = prompt_length
    logits = target_model(sequence, use_cache=False).logits[0, n - 1:-1]  # (T, V)
    p = reference_probs(logits, sampling).cpu()  # (T, V) float64
    y = sequence[0, n:].cpu()  # (T,)
    p_y = p.gather(1, y[:, None])  # (T, 1)
    ids = torch.arange(p.size(1))[None]  # (1, V)
    noise = torch.rand(y.numel(), dtype=torch.float64, generator=generator)  # (T,) U_t
    u = []
    for ranking in ORDERS if order == "both" else (order,):
        # The tokens ranked before y_t: higher p, or equal p and a smaller id (or a smaller id).
        before = (p > p_y) | ((p == p_y) & (ids < y[:, None])) if ranking == "probability" else ids < y[:, None]
        below = (p * before).sum(-1)  # (T,) F(y_t-)
        u.append((below + noise * p_y[:, 0]).clamp(0.0, 1.0))  # (T,)
    u = torch.stack(u) if order == "both" else u[0]  # (2, T) or (T,)
    return torch.where(p_y[:, 0] > 0, u, math.nan)


def _block_offsets(result: object, num_new: int) -> list[int] | None:
    """Each emitted token's offset in its block, from a `.trace` of records with `.emitted`."""
    trace = getattr(result, "trace", None)
    if not isinstance(trace, list) or not trace or not all(hasattr(record, "emitted") for record in trace):
        return None
    offsets = [j for record in trace for j in range(len(record.emitted))]
    return offsets[:num_new] if len(offsets) >= num_new else None


def _bins(u: torch.Tensor) -> tuple[dict[tuple[int, ...], int], dict[tuple[int, ...], float]]:
    """Counts of u in equal bins and the uniform law over them (n // PER_BIN bins, 2 to MAX_BINS)."""
    num_bins = max(2, min(MAX_BINS, u.numel() // PER_BIN))
    counts = torch.bincount((u * num_bins).long().clamp(max=num_bins - 1), minlength=num_bins)
    return ({(b,): int(c) for b, c in enumerate(counts.tolist()) if c},
            {(b,): 1 / num_bins for b in range(num_bins)})


def _p_value(u: torch.Tensor) -> float:
    """Pearson's chi-square p-value of u against the uniform law, on `_bins`."""
    counts, law = _bins(u)
    n, k = u.numel(), len(law)
    statistic = sum((counts.get(b, 0) - n / k) ** 2 / (n / k) for b in law)
    return chi2_sf(statistic, k - 1)


def _ks_p_value(u: torch.Tensor) -> float:
    """Kolmogorov-Smirnov p-value of u against Uniform(0, 1) (asymptotic, Stephens' correction)."""
    n = u.numel()
    ranked = u.sort().values  # (n,)
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n  # (n,)
    distance = float(torch.maximum(grid - ranked, ranked - (grid - 1 / n)).max())
    x = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * distance
    if x < 0.2:
        return 1.0
    tail = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * x * x) for k in range(1, 101))
    return min(1.0, max(0.0, tail))


def audit_every_token(generate: GenerateFn, target_model: PreTrainedModel, input_ids: torch.Tensor, *,
                      sampling: Reference, max_new_tokens: int, num_runs: int,
                      generator: torch.Generator | None = None, level: float = 1e-3, power: float = 0.9,
                      eos_token_id: int | list[int] | None = None, order: str = "both") -> AuditResult:
    """Test whether every token `generate` emits follows the target's p given its prefix.

    Args:
        generate: any `(input_ids, generator) -> sequences` callable (a tensor
            (1, n + new) or an object with `.sequences`, and `.trace` if it has one).
        target_model: the model whose sampling defines "exact", any vocabulary.
        input_ids: the prompt, shape (1, n).
        sampling: the reference: `SamplingConfig`, or the implementation's own
            processing (`laws.generate_reference`).
        max_new_tokens: the tokens each run must emit (fewer only after an EOS).
        num_runs: calls of `generate`; num_runs * max_new_tokens >= 2,000 is
            recommended (see the module docstring).
        generator: passed to every call, and draws the PIT's U.
        level: the probability that an exact decoder fails.
        power: the power at which the result states `detectable_tv`.
        eos_token_id: the target alone stops after these ids (None: never).
        order: the ranking of F: "both" (default: by p and by id, half the
            level each), "probability" or "id" alone (the whole level).

    Returns:
        A `TokenAuditResult` (`.passed`, `.summary()`, `.strata`; a stratum of
        the id ranking is named "... (by id)" under "both"), or a failing
        `AuditResult` saying "crashed: ..." if `generate` raised.

    Raises:
        ValueError / TypeError: for an argument out of range, named in the message.
    """
    for name, value in (("max_new_tokens", max_new_tokens), ("num_runs", num_runs)):
        check_integer(name, value, minimum=1)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.size(0) != 1:
        raise ValueError("input_ids must be a tensor of shape (1, n)")
    if order not in (*ORDERS, "both"):
        raise ValueError(f"order must be 'probability', 'id' or 'both', got {order!r}")
    eos = eos_set(eos_token_id)
    rankings = ORDERS if order == "both" else (order,)
    n = input_ids.size(1)
    u_runs, positions, offsets, impossible = [], [], [], 0
    for _ in range(num_runs):
        # 1. Run the decoder; a crash is the verdict.
        try:
            result = call_generate(generate, input_ids, generator)
        except GenerateCrashed as error:
            return crashed(error, num_samples=sum(u.size(1) for u in u_runs), level=level, power=power)
        sequence = as_sequences(result)[:, : n + max_new_tokens]  # (1, n + T)
        new = sequence[0, n:].tolist()
        # 2. What the target alone could not emit: past an EOS, past the budget, or too few.
        stop = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        impossible += len(new) - stop + max(0, as_sequences(result).size(1) - n - max_new_tokens)
        impossible += int(stop < max_new_tokens and not (new and new[stop - 1] in eos))
        if stop == 0:
            continue
        # 3. The PIT of each emitted token in each ranking, from one target pass.
        u = token_pits(target_model, sequence[:, : n + stop], n, sampling, generator, order=order)
        u = u.view(len(rankings), -1)  # (R, T)
        impossible += int(u[0].isnan().sum())
        kept = ~u[0].isnan()
        u_runs.append(u[:, kept])
        positions.append(torch.arange(stop)[kept])
        found = _block_offsets(result, stop)
        offsets.append(torch.tensor(found)[kept] if found is not None else None)
    if sum(values.size(1) for values in u_runs) < 2 * PER_BIN:
        error = GenerateCrashed(f"generate emitted fewer than {2 * PER_BIN} tokens the target can emit")
        return crashed(error, level=level, power=power)
    pits, position = torch.cat(u_runs, dim=1), torch.cat(positions)  # (R, N), (N,)
    offset = torch.cat(offsets) if all(o is not None for o in offsets) else None  # (N,)
    # 4. Each ranking's tests, with an equal share of the level.
    share = 1 / len(rankings)
    adjusted = []
    for u, ranking in zip(pits, rankings, strict=True):
        tag = " (by id)" if order == "both" and ranking == "id" else ""
        adjusted += _ranking_tests(u, position, offset, max_new_tokens, share, tag)
    p_value, worst, values, weight = min(adjusted, key=lambda row: row[0])
    # 5. The worst stratum's TV bounds, and the first ranking's pooled test's power.
    counts, law = _bins(values)
    test = compare_counts(counts, law, level=level * weight, power=power)
    pooled = compare_counts(*_bins(pits[0]), level=level * 0.25 * share, power=power)
    return TokenAuditResult(
        num_samples=pits.size(1), num_cells=test.num_cells, statistic=test.statistic, p_value=p_value,
        level=level, power=power, detectable_tv=pooled.detectable_tv, tv_estimate=test.tv_estimate,
        tv_noise=test.tv_noise, impossible=impossible, num_runs=num_runs, worst=worst,
        strata=tuple((name, values.numel(), p) for p, name, values, _ in adjusted), pits=pits[0])


def _ranking_tests(u: torch.Tensor, position: torch.Tensor, offset: torch.Tensor | None, max_new_tokens: int,
                   share: float, tag: str) -> list[tuple[float, str, torch.Tensor, float]]:
    """One ranking's tests over its u (N,), as (adjusted p-value, name + tag, u tested,
    share of the level): a quarter of `share` each to the pooled chi-square and
    Kolmogorov-Smirnov tests, half to the strata by position and by block offset."""
    strata = [("all tokens", u, 0.25)]
    by_position = [(f"token {t + 1}", u[position == t]) for t in range(max_new_tokens)]
    by_offset = [] if offset is None else [(f"offset {j}", u[offset == j]) for j in range(int(offset.max()) + 1)]
    for group, part in ((by_position, 0.25 if by_offset else 0.5), (by_offset, 0.25)):
        group = [(name, values) for name, values in group if values.numel() >= 2 * PER_BIN]
        strata += [(name, values, part / len(group)) for name, values in group]
    tests = [(min(1.0, _p_value(values) / (weight * share)), name + tag, values, weight * share)
             for name, values, weight in strata]
    tests.append((min(1.0, _ks_p_value(u) / (0.25 * share)), "all tokens (KS)" + tag, u, 0.25 * share))
    return tests

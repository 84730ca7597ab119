"""Audit every emitted token for exactness, at any vocabulary (chapter 4).

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
blocks or the prompt. Tokens are ranked by decreasing p (ties by id), not by id:
any fixed ranking keeps the invariant, and with this one the usual errors land in
the same place at every context (too much mass on likely tokens puts too many u
near 0, whichever tokens are likely there), instead of cancelling out.

Uniformity is tested on all u pooled, by Kolmogorov-Smirnov and by Pearson's
chi-square on equal bins (`audit.compare_counts`), a quarter of the level each, and,
so that an error at one place is not diluted, by chi-square in strata: each emitted
position t and, when the result has a `.trace` of blocks (`speculative_generate`'s),
each offset in the block (0: a block's first token, K: the bonus), the other half of
the level split evenly (a weighted Bonferroni bound: an exact decoder fails with
probability at most `level`). The reported power is the pooled chi-square's:
`detectable_tv`, the smallest TV between the binned law of the pooled u and the
uniform one that it catches with probability 0.9. At one context that TV is the
decoder's per-token TV from p; over contexts, the average of what does not cancel.
Tokens the target cannot emit (p = 0, after an EOS, beyond `max_new_tokens`) and
runs that stop early without an EOS count as `impossible`, and fail the audit.

Recommended size: num_runs >= 32 and at least 2,000 tokens, e.g. 32 runs of 64
tokens (about 20 s on the tiny pair on one idle CPU thread); the pooled test then
catches a TV of about 0.07. At that size it flags, on a random 64-token pair
(tests/test_audit_tokens.py, p < 1e-4 each): a residual drawn from p instead of
max(0, p - q); p tempered (T = 0.5) while the rule is given q at T = 1; the bonus
drawn from p_{K-1}; a cache fed the whole prefix again. False alarms of an exact
decoder at that size, over 200 seeds (`FALSE_ALARMS`): none at level 1e-3 (0.2
expected), 1 at 0.01, 11 at 0.05 (10 expected); the smallest p-value was 0.005.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .audit import AuditResult, GenerateCrashed, as_sequences, call_generate, chi2_sf, compare_counts, crashed
from .laws import GenerateFn, Reference, reference_probs
from .validation import check_integer

# False alarms measured on an exact decoder: `speculative_generate` (K = 2) on
# small_random_pair(64, seed=4, init_range=0.2), 32 runs of 64 tokens, seeds 1000-1199
# (tests/test_audit_tokens.py, slow): seeds, and the seeds failing at each level.
FALSE_ALARMS = {"seeds": 200, "at 1e-3": 0, "at 0.01": 1, "at 0.05": 11, "at 0.1": 17}
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
        """One line of at most 80 characters: verdict, where it failed, the power."""
        if self.error is not None or self.passed:
            line = super().summary()
            return line.replace("consistent with the exact law", "every token follows p")
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
        order: "probability" (rank tokens by decreasing p) or "id" (by token id).

    Returns:
        u, shape (T,), float64; NaN where p(y_t) = 0 (the target cannot emit y_t).
    """
    if order not in ("probability", "id"):
        raise ValueError(f"order must be 'probability' or 'id', got {order!r}")
    n = prompt_length
    logits = target_model(sequence, use_cache=False).logits[0, n - 1:-1]  # (T, V)
    p = reference_probs(logits, sampling).cpu()  # (T, V) float64
    y = sequence[0, n:].cpu()  # (T,)
    p_y = p.gather(1, y[:, None])  # (T, 1)
    ids = torch.arange(p.size(1))[None]  # (1, V)
    # The tokens ranked before y_t: higher p, or equal p and a smaller id (or a smaller id).
    before = (p > p_y) | ((p == p_y) & (ids < y[:, None])) if order == "probability" else ids < y[:, None]
    below = (p * before).sum(-1)  # (T,) F(y_t-)
    noise = torch.rand(y.numel(), dtype=torch.float64, generator=generator)  # (T,) U_t
    u = (below + noise * p_y[:, 0]).clamp(0.0, 1.0)  # (T,)
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
                      eos_token_id: int | list[int] | None = None, order: str = "probability") -> AuditResult:
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
        order: the ranking of F, "probability" (default) or "id".

    Returns:
        A `TokenAuditResult` (`.passed`, `.summary()`, `.strata`), or a failing
        `AuditResult` saying "crashed: ..." if `generate` raised.

    Raises:
        ValueError: for an argument out of range, named in the message.
    """
    for name, value in (("max_new_tokens", max_new_tokens), ("num_runs", num_runs)):
        check_integer(name, value, minimum=1)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.size(0) != 1:
        raise ValueError("input_ids must be a tensor of shape (1, n)")
    eos = set() if eos_token_id is None else {int(t) for t in torch.tensor(eos_token_id).view(-1).tolist()}
    n = input_ids.size(1)
    u_runs, positions, offsets, impossible = [], [], [], 0
    for _ in range(num_runs):
        # 1. Run the decoder; a crash is the verdict.
        try:
            result = call_generate(generate, input_ids, generator)
        except GenerateCrashed as error:
            return crashed(error, num_samples=sum(u.numel() for u in u_runs), level=level, power=power)
        sequence = as_sequences(result)[:, : n + max_new_tokens]  # (1, n + T)
        new = sequence[0, n:].tolist()
        # 2. What the target alone could not emit: past an EOS, past the budget, or too few.
        stop = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        impossible += len(new) - stop + max(0, as_sequences(result).size(1) - n - max_new_tokens)
        impossible += int(stop < max_new_tokens and not (new and new[stop - 1] in eos))
        if stop == 0:
            continue
        # 3. The PIT of each emitted token, from one target pass.
        u = token_pits(target_model, sequence[:, : n + stop], n, sampling, generator, order=order)  # (T,)
        impossible += int(u.isnan().sum())
        kept = ~u.isnan()
        u_runs.append(u[kept])
        positions.append(torch.arange(stop)[kept])
        found = _block_offsets(result, stop)
        offsets.append(torch.tensor(found)[kept] if found is not None else None)
    if sum(values.numel() for values in u_runs) < 2 * PER_BIN:
        error = GenerateCrashed(f"generate emitted fewer than {2 * PER_BIN} tokens the target can emit")
        return crashed(error, level=level, power=power)
    u, position = torch.cat(u_runs), torch.cat(positions)  # (N,), (N,)
    # 4. The tests and their shares of the level: a quarter each to the pooled
    # chi-square and Kolmogorov-Smirnov tests, half to the strata.
    strata = [("all tokens", u, 0.25)]
    by_position = [(f"token {t + 1}", u[position == t]) for t in range(max_new_tokens)]
    by_offset = []
    if all(o is not None for o in offsets):
        offset = torch.cat(offsets)  # (N,)
        by_offset = [(f"offset {j}", u[offset == j]) for j in range(int(offset.max()) + 1)]
    for group, share in ((by_position, 0.25 if by_offset else 0.5), (by_offset, 0.25)):
        group = [(name, values) for name, values in group if values.numel() >= 2 * PER_BIN]
        strata += [(name, values, share / len(group)) for name, values in group]
    adjusted = [(min(1.0, _p_value(values) / weight), name, values, weight) for name, values, weight in strata]
    adjusted.append((min(1.0, _ks_p_value(u) / 0.25), "all tokens (KS)", u, 0.25))
    p_value, worst, values, weight = min(adjusted, key=lambda row: row[0])
    # 5. The worst stratum's TV bounds, and the pooled test's power.
    counts, law = _bins(values)
    test = compare_counts(counts, law, level=level * weight, power=power)
    pooled = compare_counts(*_bins(u), level=level * 0.25, power=power)
    return TokenAuditResult(
        num_samples=u.numel(), num_cells=test.num_cells, statistic=test.statistic, p_value=p_value, level=level,
        power=power, detectable_tv=pooled.detectable_tv, tv_estimate=test.tv_estimate, tv_noise=test.tv_noise,
        impossible=impossible, num_runs=num_runs, worst=worst,
        strata=tuple((name, values.numel(), p) for p, name, values, _ in adjusted), pits=u)

"""Audit a decoder for exactness: do its first tokens follow the target's law? (chapter 4)

A speculative decoder is exact when what it emits is distributed as the target's
own sampling would be. `audit` checks this for any generate-like callable
`(input_ids, generator) -> sequences` (a tensor (1, n + new), or an object with
`.sequences`): it samples the first `num_tokens` emitted tokens many times and
compares their empirical law with the exact one by Pearson's chi-square test and
by total-variation distance (TV), stating how large a departure the test would
catch (its power). The exact law comes from enumeration: `target_law` for the
target's own sampling (the law any exact decoder must match), `decoder_law` for
the law a speculative rule produces ("exact" or the article's "article"), both on
a small vocabulary.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .rejection import residual_distribution
from .sampling import SamplingConfig, logits_to_probs

Law = dict[tuple[int, ...], float]  # emitted tokens -> probability
GenerateFn = Callable[[torch.Tensor, torch.Generator], object]


def _chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square with `df` degrees of freedom."""
    if x <= 0:
        return 1.0
    a, z = torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(a, z))


def _chi2_critical(level: float, df: int) -> float:
    """The x with P(X > x) = level, by bisection."""
    low, high = 0.0, float(df)
    while _chi2_sf(high, df) > level:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _chi2_sf(mid, df) > level else (low, mid)
    return high


def _noncentral_power(critical: float, df: int, noncentrality: float) -> float:
    """P(X > critical) for X ~ noncentral chi-square(df, noncentrality)."""
    half = noncentrality / 2
    total, j, weight_sum = 0.0, 0, 0.0
    while weight_sum < 1 - 1e-12 and j < 100_000:
        # Poisson(half) weight of the j-th term, in logs for large `half`.
        weight = math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) if half > 0 else float(j == 0)
        total += weight * _chi2_sf(critical, df + 2 * j)
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

    @property
    def passed(self) -> bool:
        """True when the sample is consistent with the exact law at `level`."""
        return self.impossible == 0 and self.p_value >= self.level

    @property
    def tv_lower_bound(self) -> float:
        """The decoder's true TV from the exact law is at least this, w.p. 1 - level."""
        return max(0.0, self.tv_estimate - self.tv_noise)

    def summary(self) -> str:
        """One line of at most 80 characters: verdict, TV bound, detectable TV."""
        verdict = "PASS" if self.passed else "FAIL"
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


def _as_sequences(result: object) -> torch.Tensor:
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
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
    if not callable(generate):
        raise TypeError(f"generate must be callable (input_ids, generator) -> sequences, got {generate!r}")
    n = input_ids.size(1)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(num_samples):
        new = _as_sequences(generate(input_ids, generator))[0, n:]
        if new.numel() < num_tokens:
            raise ValueError(f"generate emitted {new.numel()} tokens, fewer than num_tokens = {num_tokens}")
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
    p_value = _chi2_sf(statistic, k - 1)
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
        generator: the randomness passed to every call.
        level: the probability that an exact decoder fails (the test's size).
        power: the power at which the result states `detectable_tv`.

    Returns:
        An `AuditResult`; `.passed` and `.summary()` give the verdict.

    Raises:
        ValueError: if the outcomes of `law` are not `num_tokens` long, or
            another argument is out of range (named in the message).
    """
    lengths = {len(outcome) for outcome in law}
    if lengths != {num_tokens}:
        raise ValueError(f"law's outcomes must all have num_tokens = "
                         f"{num_tokens} tokens, got lengths {lengths}")
    # Sample the decoder: counts of its first num_tokens emitted tokens.
    counts = sample_emissions(generate, input_ids, num_samples=num_samples,
                              num_tokens=num_tokens, generator=generator)
    # Compare them with the exact law: chi-square, TV and the stated power.
    return compare_counts(counts, law, level=level, power=power)


def _next_probs(model: PreTrainedModel, sequences: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The processed next-token distributions of a batch of sequences (B, L) -> (B, V), float64."""
    logits = model(sequences, use_cache=False).logits[:, -1]  # (B, V)
    probs = logits_to_probs(logits, sampling).double()  # (B, V)
    # Renormalize in float64: float32 rows sum to 1 only within about 1e-7, and
    # the rule's bookkeeping (sum of max(0, q - p) = sum of max(0, p - q)) needs
    # both rows to sum to 1 to the last bit for laws that agree to 1e-12.
    return probs / probs.sum(-1, keepdim=True)


def _check_enumeration(input_ids: torch.Tensor, num_tokens: int, vocab: int, max_outcomes: int) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.size(0) != 1:
        raise ValueError("input_ids must be a tensor of shape (1, n)")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
    if vocab ** num_tokens > max_outcomes:
        raise ValueError(f"num_tokens = {num_tokens} over a vocabulary of {vocab} gives {vocab} ** {num_tokens} "
                         f"outcomes, more than max_outcomes = {max_outcomes}: use fewer tokens")


@torch.no_grad()
def target_law(target_model: PreTrainedModel, input_ids: torch.Tensor, sampling: SamplingConfig = SamplingConfig(),
               num_tokens: int = 1, *, max_outcomes: int = 1 << 16) -> Law:
    """The exact law of the target's next `num_tokens` sampled tokens, by enumeration.

    Args:
        target_model: the model whose sampling defines "exact".
        input_ids: the prompt, shape (1, n).
        sampling: temperature / top-k / top-p (`logits_to_probs`).
        num_tokens: outcome length; V ** num_tokens must stay <= max_outcomes.
        max_outcomes: a guard against enumerations too large to run.

    Returns:
        {tokens: probability} over outcomes of positive probability (float64).
    """
    vocab = target_model.get_output_embeddings().weight.size(0)
    _check_enumeration(input_ids, num_tokens, vocab, max_outcomes)
    # One pass per prefix, the same passes `decoder_law` makes: equal inputs, equal p.
    law: Law = {(): 1.0}
    for _ in range(num_tokens):
        grown: Law = {}
        for prefix, mass in law.items():
            ids = torch.tensor([prefix], dtype=input_ids.dtype, device=input_ids.device).view(1, -1)
            probs = _next_probs(target_model, torch.cat([input_ids, ids], dim=1), sampling)[0].cpu()  # (V,)
            for y in probs.nonzero().flatten().tolist():
                grown[prefix + (y,)] = mass * float(probs[y])
        law = grown
    return law


@torch.no_grad()
def decoder_law(target_model: PreTrainedModel, draft_model: PreTrainedModel, input_ids: torch.Tensor, *,
                num_draft_tokens: int, sampling: SamplingConfig = SamplingConfig(), num_tokens: int = 1,
                rule: str = "exact", max_outcomes: int = 1 << 16) -> Law:
    """The exact law of a speculative decoder's first `num_tokens` tokens, by enumeration.

    Every draft the draft model can sample is followed, each accept / reject
    branch weighted by its probability; a block that ends before `num_tokens`
    tokens is followed by the next block, as in the decoder's loop.

    Args:
        target_model, draft_model: the pair (small vocabulary).
        input_ids: the prompt, shape (1, n).
        num_draft_tokens: K drafted per block (>= 1).
        sampling: applied to both models; temperature > 0.
        num_tokens: outcome length; V ** num_tokens must stay <= max_outcomes.
        rule: "exact" (residual after a rejection) or "article" (p after a rejection).
        max_outcomes: a guard against enumerations too large to run.

    Returns:
        {tokens: probability} (float64); with rule "exact" it equals `target_law`.
    """
    if rule not in ("exact", "article"):
        raise ValueError(f"rule must be 'exact' or 'article', got {rule!r}")
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
    if sampling.greedy:
        raise ValueError("sampling must have temperature > 0: a greedy decoder has no law to enumerate")
    vocab = target_model.get_output_embeddings().weight.size(0)
    _check_enumeration(input_ids, num_tokens, vocab, max_outcomes)
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def p_and_q(context: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        # The two models' processed distributions after prompt + context.
        if context not in cache:
            ids = torch.tensor([context], dtype=input_ids.dtype, device=input_ids.device).view(1, -1)
            sequence = torch.cat([input_ids, ids], dim=1)  # (1, n + len)
            cache[context] = (_next_probs(target_model, sequence, sampling)[0].cpu(),
                              _next_probs(draft_model, sequence, sampling)[0].cpu())
        return cache[context]

    law: Law = {}

    def emit(context: tuple[int, ...], mass: float) -> None:
        # `context` was emitted with probability `mass`; continue with a new block.
        if len(context) >= num_tokens:
            law[context[:num_tokens]] = law.get(context[:num_tokens], 0.0) + mass
        else:
            block(context, (), mass)

    def block(context: tuple[int, ...], accepted: tuple[int, ...], mass: float) -> None:
        # `accepted`: drafts of this block accepted so far (drawn and kept w.p. mass).
        if len(context) + len(accepted) >= num_tokens:
            emit(context + accepted, mass)  # later tokens cannot change the outcome
            return
        p, q = p_and_q(context + accepted)
        if len(accepted) == num_draft_tokens:
            # All K accepted: the bonus token from p_K.
            for y in p.nonzero().flatten().tolist():
                emit(context + accepted + (y,), mass * float(p[y]))
            return
        after_reject = residual_distribution(p, q) if rule == "exact" else p
        for x in q.nonzero().flatten().tolist():
            accept = min(1.0, float(p[x]) / float(q[x]))
            if accept < 1:
                # Rejected: one token from the residual (or p), and the block ends.
                for y in after_reject.nonzero().flatten().tolist():
                    emit(context + accepted + (y,), mass * float(q[x]) * (1 - accept) * float(after_reject[y]))
            if accept > 0:
                block(context, accepted + (x,), mass * float(q[x]) * accept)

    block((), (), 1.0)
    return law


def law_tv(first: Mapping[tuple[int, ...], float], second: Mapping[tuple[int, ...], float]) -> float:
    """Total-variation distance between two laws over outcomes: half the L1 distance."""
    outcomes = set(first) | set(second)
    return 0.5 * sum(abs(first.get(o, 0.0) - second.get(o, 0.0)) for o in outcomes)


def random_pair(vocab_size: int = 8, *, seed: int = 0, width: int = 32,
                init_range: float = 0.5) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A random-init GPT-2 target (2 layers) and draft (1 layer) on a small vocabulary.

    Independent random weights make p and q differ a lot, which is what an audit
    needs; a small vocabulary makes the exact laws enumerable.

    Args:
        vocab_size: V >= 2 (keep V ** num_tokens small for the enumerations).
        seed: seeds the weights (through torch's global generator).
        width: the hidden size of both models.
        init_range: the standard deviation of the random weights; larger
            spreads the logits, so p and q differ more.

    Returns:
        (target_model, draft_model), float32, eval mode; the last token id is
        BOS / EOS / padding, and `generate` never stops early (no EOS).

    Raises:
        ValueError: if `vocab_size` is not an integer >= 2.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    models = []
    for layers, offset in ((2, 0), (1, 1)):
        torch.manual_seed(seed * 2 + offset)
        config = GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=width, n_layer=layers, n_head=2,
                            bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1, pad_token_id=None,
                            initializer_range=init_range)
        model = GPT2LMHeadModel(config).eval()
        # Never stop early in `generate`: the audit counts a fixed number of tokens.
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = vocab_size - 1
        models.append(model)
    return models[0], models[1]


def transformers_assisted(target_model: PreTrainedModel, draft_model: PreTrainedModel, *, max_new_tokens: int,
                          num_draft_tokens: int = 4, sampling: SamplingConfig = SamplingConfig()) -> GenerateFn:
    """`transformers`' assisted generation as a generate-like callable for `audit`.

    `generate` draws from torch's global generator, so each call reseeds it from
    `generator` (the global state is changed). Sampling settings are passed
    explicitly (`SamplingConfig.generate_kwargs`: generate's top_k=50 default off)
    and the assistant drafts a constant `num_draft_tokens` per iteration.
    """
    if sampling.greedy:
        raise ValueError("sampling must have temperature > 0: the audit is for sampling")
    draft_model.generation_config.num_assistant_tokens = num_draft_tokens
    draft_model.generation_config.num_assistant_tokens_schedule = "constant"
    draft_model.generation_config.assistant_confidence_threshold = 0.0
    kwargs = sampling.generate_kwargs()

    def generate(input_ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        torch.manual_seed(seed)
        return target_model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                     assistant_model=draft_model, max_new_tokens=max_new_tokens,
                                     pad_token_id=target_model.generation_config.pad_token_id, **kwargs)

    return generate

"""The source article's decoding loop, reproduced to measure its errors (chapters 4-5).

NOT FOR USE. This module rebuilds, in our own code, the structure of the loop in
github.com/jaygala223/scratch `speculative_decoding.py` (the code of "Speculative
Decoding: From Theory to Implementation"), so the book can run it on the same models
as `specdec_ref.decoder` and measure where it goes wrong. The correct loop is
`specdec_ref.decoder.speculative_generate`.

What is kept from the article, each on purpose (line numbers refer to its file):

1. Erratum 1, zero residual (lines 130-140): after a rejection it subtracts the
   target's own softmax from itself, p - p = 0, finds no mass and falls back to
   sampling from p. The emitted token then follows min(p, q) + (1 - beta) p,
   not p (`article_correction`).
2. Erratum 2, scalar q (line 75): drafting keeps only q(x) of the drafted token,
   so the residual max(0, p - q) cannot be formed at all (`article_draft`).
3. Erratum 3, overshoot (lines 179-191): every iteration drafts K tokens whatever
   the budget left, so `sequences` may hold up to K tokens more than
   `max_new_tokens`.
4. Erratum 4, no EOS (lines 179-208): `eos_token_id` is accepted and ignored; the
   loop runs past an end-of-sequence token.
5. Erratum 5, no KV cache (lines 66 and 107): every pass re-reads the whole sequence.
6. Erratum 7, "acceptance rate" (lines 189-190 and 217): every emitted token counts
   as accepted, the correction and bonus included, so `accepted / drafted` can
   exceed 1.
7. Erratum 10, the bonus test: "all drafts accepted" is tested by length,
   `len(accepted_tokens) == len(draft_tokens)`, which also holds after a rejection
   at the last slot (K - 1 accepted drafts and the correction). A "bonus" is then
   drawn from p_K, the target's distribution after the rejected draft: at K = 1
   every block emits two tokens. `article_law` gives the law this loop emits.

Two changes make it measurable, and neither changes its law: randomness comes only
from the `generator` argument (the article uses the global RNG), and a
`temperature` divides both models' logits (the article samples at T = 1 only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .laws import Law, reference_probs
from .sampling import SamplingConfig, draw_device
from .validation import check_integer, model_device


@dataclass
class ArticleIteration:
    """What one iteration of the article's loop drafted and emitted."""

    drafted: list[int]  # the K drafted token ids
    emitted: list[int]  # accepted drafts + one correction or bonus token (1 to K + 1)


@dataclass
class ArticleOutput:
    """The article loop's result and the counters it keeps, as it keeps them."""

    # (1, n + new) token ids; new may exceed max_new_tokens by up to K (erratum 3).
    sequences: torch.Tensor
    # Tokens the draft proposed: iterations * K, the article's denominator.
    drafted: int = 0
    # Tokens the article calls accepted: every emitted token, correction and
    # bonus included (erratum 7).
    accepted: int = 0
    # Draft-verify rounds; the target runs once per round.
    iterations: int = 0
    # One record per iteration, in order.
    trace: list[ArticleIteration] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """The article's "average acceptance rate": accepted / drafted, may exceed 1."""
        return self.accepted / self.drafted if self.drafted else float("nan")


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32, as the article's softmax at T = 1."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One multinomial draw, on the generator's device, like the article's."""
    return int(torch.multinomial(probs.to(draw_device(generator)), 1, generator=generator))


def _coin(ratio: float, generator: torch.Generator | None) -> bool:
    """The article's acceptance test, `torch.rand(1) < ratio`: True w.p. min(1, ratio)."""
    return float(torch.rand(1, generator=generator, device=draw_device(generator))) < ratio


@torch.no_grad()
def article_draft(
    draft_model: PreTrainedModel,
    input_ids: torch.Tensor,
    num_draft_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[float]]:
    """The article's drafting: K tokens and the scalar q(x) of each (erratum 2).

    Args:
        draft_model: the small model.
        input_ids: the sequence so far, shape (1, n).
        num_draft_tokens: K.
        temperature: divides the logits (the article: 1).
        generator: the only source of randomness.

    Returns:
        (drafted token ids, q_i(x_i) for each): the rest of q_i is thrown away.
    """
    tokens, scalars = [], []
    sequence = input_ids
    for _ in range(num_draft_tokens):
        # No cache: the whole sequence again (erratum 5).
        logits = draft_model(sequence, use_cache=False).logits[0, -1]  # (V,)
        q = _probs(logits, temperature)  # (V,)
        token = _draw(q, generator)
        tokens.append(token)
        scalars.append(float(q[token]))  # the only trace of q kept
        new = torch.tensor([[token]], dtype=sequence.dtype, device=sequence.device)
        sequence = torch.cat([sequence, new], dim=1)  # (1, n + i + 1)
    return tokens, scalars


def article_correction(
    target_probs: torch.Tensor, target_logits: torch.Tensor, temperature: float,
    generator: torch.Generator | None,
) -> int:
    """The token after a rejection, as the article computes it (erratum 1)."""
    # Its "adjusted" distribution subtracts the target's own softmax: p - p = 0.
    adjusted = (target_probs - _probs(target_logits, temperature)).clamp(min=0)
    if adjusted.sum() > 0:  # never true
        return _draw(adjusted / adjusted.sum(), generator)
    # So every rejection falls back to a plain sample from p.
    return _draw(target_probs, generator)


@torch.no_grad()
def article_verify(
    target_model: PreTrainedModel,
    input_ids: torch.Tensor,
    drafted: list[int],
    draft_scalars: list[float],
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[int]:
    """The article's verification and acceptance: 1 to K + 1 emitted tokens.

    Args:
        target_model: the large model.
        input_ids: the sequence before the drafts, shape (1, n).
        drafted: the K drafted ids; draft_scalars: q_i(x_i) for each.
        temperature: divides the logits (the article: 1).
        generator: the only source of randomness.

    Returns:
        The accepted drafts, then one correction (drawn from p, not from the
        residual) or one bonus token from p_K; after a rejection at the last
        slot, the correction and a "bonus" from p_K (erratum 10).
    """
    drafts = torch.tensor([drafted], dtype=input_ids.dtype,
                          device=input_ids.device)  # (1, K)
    sequence = torch.cat([input_ids, drafts], dim=1)  # (1, n + K)
    logits = target_model(sequence, use_cache=False).logits[0]  # (n + K, V)
    n, emitted = input_ids.size(1), []
    for i, token in enumerate(drafted):
        p = _probs(logits[n - 1 + i], temperature)  # (V,)
        ratio = min(1.0, float(p[token]) / draft_scalars[i])
        if _coin(ratio, generator):
            emitted.append(token)
            continue
        emitted.append(article_correction(p, logits[n - 1 + i], temperature,
                                          generator))
        break
    # "All accepted" tested by length (erratum 10): after a rejection at the
    # last slot the correction makes the length K too, and a "bonus" is drawn
    # from p_K, the target's distribution after the rejected draft.
    if len(emitted) == len(drafted):
        bonus = _probs(logits[n - 1 + len(drafted)], temperature)  # (V,)
        emitted.append(_draw(bonus, generator))
    return emitted


@torch.no_grad()
def article_generate(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    num_draft_tokens: int = 4,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> ArticleOutput:
    """The article's generation loop, errors included (see the module docstring).

    Args:
        target_model: the large model.
        draft_model: the small model, sharing the target's vocabulary.
        input_ids: the prompt, shape (1, n).
        max_new_tokens: the loop stops once at least this many tokens were
            emitted; it may overshoot by up to K (erratum 3).
        num_draft_tokens: K >= 1, drafted every iteration.
        temperature: > 0, divides both models' logits (the article: 1).
        generator: the only source of randomness.
        eos_token_id: accepted for a drop-in signature and ignored (erratum 4).

    Returns:
        An `ArticleOutput`: `.sequences`, the article's `.drafted` and `.accepted`
        counters, `.iterations` and a per-iteration `.trace`.

    Raises:
        ValueError / TypeError: if an argument is malformed (named in the message).
    """
    _check(input_ids, max_new_tokens, num_draft_tokens, temperature, generator)
    if model_device(target_model) != input_ids.device:
        raise ValueError(f"input_ids is on {input_ids.device} but target_model is on "
                         f"{model_device(target_model)}")
    del eos_token_id  # erratum 4: never looked at
    out = ArticleOutput(input_ids)
    generated = 0
    while generated < max_new_tokens:
        out.iterations += 1
        drafted, scalars = article_draft(draft_model, out.sequences, num_draft_tokens,
                                         temperature, generator)
        emitted = article_verify(target_model, out.sequences, drafted, scalars,
                                 temperature, generator)
        # Erratum 7: the correction and bonus count as "accepted".
        out.accepted += len(emitted)
        out.drafted += num_draft_tokens
        generated += len(emitted)
        out.trace.append(ArticleIteration(drafted, emitted))
        new = torch.tensor([emitted], dtype=input_ids.dtype, device=input_ids.device)
        out.sequences = torch.cat([out.sequences, new], dim=1)
    return out


@torch.no_grad()
def article_law(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    num_draft_tokens: int,
    num_tokens: int,
    temperature: float = 1.0,
    max_outcomes: int = 1 << 16,
) -> Law:
    """The exact law of the first `num_tokens` tokens of `article_generate`, by enumeration.

    Every branch of the article's loop is followed, as `laws.decoder_law` does for
    the correct one: the drafts, each accept / reject coin, a correction drawn from
    p after a rejection (erratum 1) and, after a rejection at the last slot, the
    extra token from the target's distribution after the rejected draft (erratum 10).

    Args:
        target_model, draft_model: the pair (small vocabulary).
        input_ids: the prompt, shape (1, n).
        num_draft_tokens: K >= 1.
        num_tokens: outcome length; V ** num_tokens must stay <= max_outcomes.
        temperature: > 0, divides both models' logits.
        max_outcomes: a guard against enumerations too large to run.

    Returns:
        {tokens: probability} (float64), to compare with `laws.target_law`.
    """
    check_integer("num_draft_tokens", num_draft_tokens, minimum=1)
    check_integer("num_tokens", num_tokens, minimum=1)
    vocab = target_model.get_output_embeddings().weight.size(0)
    if vocab ** num_tokens > max_outcomes:
        raise ValueError(f"num_tokens = {num_tokens} over a vocabulary of {vocab} gives more than "
                         f"max_outcomes = {max_outcomes} outcomes: use fewer tokens")
    sampling, k, rows = SamplingConfig(temperature=temperature), num_draft_tokens, {}

    def p_and_q(context: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        # Both models' distributions after prompt + context, float64, once each.
        if context not in rows:
            ids = torch.tensor([context], dtype=input_ids.dtype, device=input_ids.device).view(1, -1)
            sequence = torch.cat([input_ids, ids], dim=1)  # (1, n + len)
            rows[context] = tuple(reference_probs(m(sequence, use_cache=False).logits[0, -1], sampling).cpu()
                                  for m in (target_model, draft_model))  # (V,), (V,)
        return rows[context]

    law: Law = {}

    def emit(tokens: tuple[int, ...], mass: float) -> None:
        # `tokens` were emitted with probability `mass`: record them or start a new block.
        if len(tokens) >= num_tokens:
            law[tokens[:num_tokens]] = law.get(tokens[:num_tokens], 0.0) + mass
        else:
            block(tokens, (), mass)

    def spread(tokens: tuple[int, ...], probs: torch.Tensor, mass: float) -> None:
        # One more token drawn from `probs`, unless the outcome is already complete.
        if len(tokens) >= num_tokens:
            emit(tokens, mass)
            return
        for y in probs.nonzero().flatten().tolist():
            emit(tokens + (y,), mass * float(probs[y]))

    def block(context: tuple[int, ...], drafts: tuple[int, ...], mass: float) -> None:
        # `drafts`: this block's drafts so far, all accepted (w.p. mass).
        if len(context) + len(drafts) >= num_tokens:
            emit(context + drafts, mass)
            return
        p, q = p_and_q(context + drafts)
        if len(drafts) == k:  # all K accepted: the bonus from p_K
            spread(context + drafts, p, mass)
            return
        for x in q.nonzero().flatten().tolist():
            accept = min(1.0, float(p[x]) / float(q[x]))
            reject = mass * float(q[x]) * (1 - accept)
            if accept < 1 and len(drafts) < k - 1:  # the correction from p ends the block
                spread(context + drafts, p, reject)
            elif accept < 1 and len(context) + len(drafts) + 1 >= num_tokens:
                spread(context + drafts, p, reject)  # the extra token lies past the outcome
            elif accept < 1:
                # Last slot: the correction from p, then one from p after the rejected x.
                after = p_and_q(context + drafts + (x,))[0]
                for y in p.nonzero().flatten().tolist():
                    spread(context + drafts + (y,), after, reject * float(p[y]))
            if accept > 0:
                block(context, drafts + (x,), mass * float(q[x]) * accept)

    block((), (), 1.0)
    return law


def _check(input_ids, max_new_tokens, num_draft_tokens, temperature, generator) -> None:
    """ValueError / TypeError naming the argument for anything the loop cannot run."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.size(0) != 1:
        raise ValueError("input_ids must be a tensor of shape (1, n), got "
                         f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else input_ids!r}")
    if input_ids.size(1) == 0:
        raise ValueError("input_ids is empty: the prompt must have at least one token")
    check_integer("max_new_tokens", max_new_tokens, minimum=0)
    check_integer("num_draft_tokens", num_draft_tokens, minimum=1)
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature) or temperature <= 0):
        raise ValueError(f"temperature must be a finite number > 0 (the article samples), got {temperature!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")

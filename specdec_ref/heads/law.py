"""The exact law of the decoder with a draft head, by enumeration (as `laws.decoder_law`).

A head's q is not a function of the sequence alone, as a draft model's is: it depends
on where the round began. EAGLE's second draft reads the head's own predicted feature,
made at the round's start; Medusa's head k reads the feature of the round's last
verified position, whatever was drafted since. So the enumeration asks the drafter
itself, round by round: for a round that starts after `context` with drafts d_1..d_i
so far, q_{i+1} is what the drafter's own `draft` gives with the target's features of
the prompt and `context` (one fresh `FeatureSource` pass) and d_1..d_i replayed
(`HeadDrafter.replay`). As in `speculative_generate`, the first round drafts nothing
(the target has read nothing yet): it is one token from p.

Every branch is followed with its probability: each draft x ~ q_i, accepted with
min(1, p(x) / q_i(x)), else one token from the residual max(0, p - q_i) (rule "exact")
or from p (rule "article", the biased variant). Invariant: with the exact rule the law
of the first `num_tokens` tokens is `laws.target_law`'s to 1e-12, for any head, trained
or not: chapter 4's rule needs nothing of q (tests/test_heads.py).
"""

from __future__ import annotations

import torch

from ..laws import Law, reference_probs
from ..rejection import residual_distribution
from ..sampling import SamplingConfig
from .drafters import HeadDrafter


@torch.no_grad()
def head_law(drafter: HeadDrafter, input_ids: torch.Tensor, *, num_draft_tokens: int,
             sampling: SamplingConfig, num_tokens: int, rule: str = "exact") -> Law:
    """The law of the first `num_tokens` tokens of `speculative_generate(drafter.source,
    drafter, ...)`, by enumeration.

    Args:
        drafter: a head's drafter; its `source` is the target (a small vocabulary).
        input_ids: the prompt, shape (1, n).
        num_draft_tokens: K drafted per round (>= 1).
        sampling: for both p and q, temperature > 0.
        num_tokens: outcome length (V ** num_tokens outcomes at most).
        rule: "exact" (the residual after a rejection) or "article" (p after one).

    Returns:
        {tokens: probability} (float64).

    Raises:
        ValueError: for another rule, greedy sampling or K < 1.
    """
    if rule not in ("exact", "article"):
        raise ValueError(f"rule must be 'exact' or 'article', got {rule!r}")
    if sampling.greedy:
        raise ValueError("sampling must have temperature > 0: a greedy decoder has no law to enumerate")
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
    source, model = drafter.source, drafter.source.model
    drafter = drafter.bind(sampling, None)
    vocab = source.parts.lm_head.weight.size(0)
    p_rows: dict[tuple[int, ...], torch.Tensor] = {}
    q_rows: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor | None] = {}

    def sequence(tokens: tuple[int, ...]) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device).view(1, -1)
        return torch.cat([input_ids, ids], dim=1)  # (1, n + len)

    def p(tokens: tuple[int, ...]) -> torch.Tensor:
        # The target's processed distribution after prompt + tokens, as target_law's.
        if tokens not in p_rows:
            logits = model(sequence(tokens), use_cache=False).logits[:, -1]  # (1, V)
            p_rows[tokens] = reference_probs(logits, sampling)[0].cpu()  # (V,)
        return p_rows[tokens]

    def q(context: tuple[int, ...], drafts: tuple[int, ...]) -> torch.Tensor | None:
        # The drafter's q for the next draft of a round that began after `context`
        # (None: it drafts no more, as Medusa past its last head).
        if (context, drafts) not in q_rows:
            ids = sequence(context)  # (1, m)
            source.rollback(0)
            drafter.rollback(0)
            source.last_logits(ids[:, :-1], 1)  # the target's features of x_0..x_{m-2}
            drafter.replay = list(drafts)
            rows = drafter.draft(ids, len(drafts) + 1, vocab).probs  # (len + 1, V), or fewer
            drafter.replay = None
            row = rows[len(drafts)].double().cpu() if len(rows) > len(drafts) else None  # (V,)
            q_rows[(context, drafts)] = None if row is None else row / row.sum()
        return q_rows[(context, drafts)]

    law: Law = {}

    def emit(context: tuple[int, ...], mass: float) -> None:
        # `context` was emitted with probability `mass`; a new round follows.
        if len(context) >= num_tokens:
            law[context[:num_tokens]] = law.get(context[:num_tokens], 0.0) + mass
        elif not context:
            # The first round drafts nothing: one token from p.
            row = p(context)
            for y in row.nonzero().flatten().tolist():
                emit((y,), mass * float(row[y]))
        else:
            round_(context, (), mass)

    def round_(context: tuple[int, ...], accepted: tuple[int, ...], mass: float) -> None:
        if len(context) + len(accepted) >= num_tokens:
            emit(context + accepted, mass)  # later tokens cannot change the outcome
            return
        target = p(context + accepted)
        proposal = q(context, accepted) if len(accepted) < num_draft_tokens else None
        if proposal is None:  # every draft accepted: the bonus token
            for y in target.nonzero().flatten().tolist():
                emit(context + accepted + (y,), mass * float(target[y]))
            return
        after_reject = residual_distribution(target, proposal) if rule == "exact" else target
        for x in proposal.nonzero().flatten().tolist():
            accept = min(1.0, float(target[x]) / float(proposal[x]))
            if accept < 1:
                for y in after_reject.nonzero().flatten().tolist():
                    emit(context + accepted + (y,), mass * float(proposal[x]) * (1 - accept) * float(after_reject[y]))
            if accept > 0:
                round_(context, accepted + (x,), mass * float(proposal[x]) * accept)

    emit((), 1.0)
    return law

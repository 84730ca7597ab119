"""Acceptance measured on a real pair: beta per context, alpha = E[beta] over text.

The performance model (`analysis`) takes alpha as a number. Here it is measured:
beta = sum_x min(p(x), q(x)) is the chance the rejection rule accepts one drafted
token in a given context (Leviathan et al., 2023, section 3.1), and alpha is its mean
over the contexts the target itself produces. A run's trace gives a second estimate,
accepted drafts over drafts actually tested, which is not the decoder's
`acceptance_rate` (accepted / drafted counts the untested drafts after a rejection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .decoder import IterationRecord, autoregressive_generate
from .sampling import SamplingConfig
from .verification import target_distributions


def acceptance_beta(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)): the chance the rule accepts a token drafted from q, per row.

    Args:
        p, q: target and draft distributions of the same shape (..., V).

    Returns:
        beta, shape (...,), in [0, 1]; 1 - beta is the total-variation distance of p and q.
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q.to(p.dtype)).sum(-1)  # (...,)


@dataclass(frozen=True)
class AlphaEstimate:
    """alpha = E[beta] over the positions of continuations the target generated."""

    betas: tuple[float, ...]  # beta at every scored position, all prompts together

    @property
    def alpha(self) -> float:
        return sum(self.betas) / len(self.betas)

    @property
    def standard_error(self) -> float:
        """Standard error of the mean (positions of one text are correlated: a lower bound)."""
        n = len(self.betas)
        if n < 2:
            return float("nan")
        mean = self.alpha
        return math.sqrt(sum((b - mean) ** 2 for b in self.betas) / (n - 1) / n)


@torch.no_grad()
def measure_alpha(target_model: PreTrainedModel, draft_model: PreTrainedModel, prompts: Sequence[torch.Tensor], *,
                  max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                  generator: torch.Generator | None = None) -> AlphaEstimate:
    """Estimate alpha for a model pair by averaging beta over text the target generates.

    For each prompt (1, n) the target continues the text (so contexts follow p), then one
    pass of each model over prompt + continuation gives p and q at every position
    (`verification.target_distributions`), and beta is computed position by position.
    """
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    betas: list[float] = []
    for prompt in prompts:
        out = autoregressive_generate(target_model, prompt, max_new_tokens=max_new_tokens,
                                      sampling=sampling, generator=generator)
        continuation = out.sequences[0, prompt.size(1):]  # (L,)
        p = target_distributions(target_model, prompt, continuation, sampling)  # (L + 1, V)
        q = target_distributions(draft_model, prompt, continuation, sampling)  # (L + 1, V)
        betas.extend(acceptance_beta(p, q).tolist())
    return AlphaEstimate(tuple(betas))


def alpha_from_trace(trace: Sequence[IterationRecord]) -> float:
    """alpha estimated from a run's iterations: accepted drafts / drafts actually tested.

    Drafts after the first rejection are never tested, so accepted / drafted (the
    decoder's `acceptance_rate`) underestimates alpha; this is the maximum-likelihood
    estimate under the independent-acceptance model.
    """
    accepted = sum(r.num_accepted for r in trace)
    tested = sum(r.num_judged for r in trace)
    return accepted / tested if tested else float("nan")

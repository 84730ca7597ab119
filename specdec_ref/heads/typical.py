"""Medusa's "typical acceptance", and the size of the change it makes to the output law.

The rule (FasterDecoding/Medusa, medusa/model/utils.py, `evaluate_posterior`, branch
`sampling == 'typical'`; the line number was not verified in this session): with
p = softmax(logits / T) the target's distribution at a drafted position and
H(p) = -sum p log(p + 1e-5) its entropy, a draft x is accepted when

    p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))

(defaults 0.09 and 0.3 in Medusa's code). The test never reads q: unlike chapter 4's
min(1, p(x) / q(x)) it cannot correct for what the drafter over-proposes, so the law of
the output is not p's. `first_token_law` enumerates that law for one drafted position
(after a rejection the token is drawn from p, the most generous choice for the rule),
and `law_tv` measures its total-variation distance from p: the size of the change.
"""

from __future__ import annotations

import torch


def typical_threshold(p: torch.Tensor, posterior_threshold: float = 0.09,
                      posterior_alpha: float = 0.3) -> torch.Tensor:
    """Medusa's acceptance threshold for the distribution(s) p, shape (..., V)."""
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)  # (...)
    return torch.minimum(torch.full_like(entropy, posterior_threshold),
                         torch.exp(-entropy) * posterior_alpha)


def typical_accepts(p: torch.Tensor, draft: torch.Tensor, posterior_threshold: float = 0.09,
                    posterior_alpha: float = 0.3) -> torch.Tensor:
    """Whether Medusa accepts each draft: p (..., V), draft (...) token ids."""
    chosen = p.gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # (...)
    return chosen > typical_threshold(p, posterior_threshold, posterior_alpha)


def first_token_law(p: torch.Tensor, q: torch.Tensor, rule: str = "typical",
                    posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> torch.Tensor:
    """The exact law of the token emitted at one drafted position, by enumeration.

    Args:
        p: the target's distribution, shape (V,).
        q: the drafter's distribution, shape (V,).
        rule: "typical" (Medusa's threshold, p after a rejection) or "exact"
            (min(1, p/q), the residual after a rejection).

    Returns:
        The law, shape (V,), float64.
    """
    p, q = p.double(), q.double()
    if rule == "exact":
        accept = torch.where(q > 0, torch.clamp(p / q.clamp_min(1e-300), max=1.0), torch.zeros_like(p))
        residual = torch.clamp(p - q, min=0.0)
        rejected = float((q * (1 - accept)).sum())
        after = residual / residual.sum() if residual.sum() > 0 else p
        return q * accept + rejected * after
    if rule != "typical":
        raise ValueError(f"rule must be 'typical' or 'exact', got {rule!r}")
    accept = (p > typical_threshold(p, posterior_threshold, posterior_alpha)).double()  # (V,)
    return q * accept + float((q * (1 - accept)).sum()) * p


def law_tv(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total-variation distance between two distributions on the same support."""
    return 0.5 * float((a.double() - b.double()).abs().sum())

"""Medusa's "typical acceptance", and the size of the change it makes to the output law.

The rule (FasterDecoding/Medusa at commit 10a2697, medusa/model/utils.py lines 274-321,
`evaluate_posterior`: `posterior_prob = ...` at line 310 to
`posterior_mask = candidates_prob > threshold` at line 321): with
p = softmax(logits / T) the target's distribution at a drafted position and
H(p) = -sum p log(p + 1e-5) its entropy, a draft x is accepted when

    p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))

(defaults 0.09 and 0.3: `medusa_generate`, medusa/model/medusa_model.py lines 221
and 223). The test never reads q: unlike chapter 4's
min(1, p(x) / q(x)) it cannot correct for what the drafter over-proposes, so the law of
the output is not p's. `first_token_law` enumerates that law for one drafted position
(after a rejection the token is drawn from p, the most generous choice for the rule:
that commit's next candidate starts from the target's argmax, `generate_candidates`),
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
    return 0.5 * float((a.detach().double() - b.detach().double()).abs().sum())


@torch.no_grad()
def naive_generate(target, draft, input_ids: torch.Tensor, *, num_draft_tokens: int, max_new_tokens: int,
                   sampling, generator: torch.Generator, rule: str = "typical") -> torch.Tensor:
    """A cache-free speculative decoder with either rule, for audits on small pairs.

    Each round drafts K tokens from `draft` (sampled from q), runs the target once,
    accepts by `rule` ("typical": Medusa's threshold, then a token from p at the
    first rejected position; "exact": min(1, p/q), then one from the residual), and
    emits the bonus from p when every draft is accepted. Returns (1, n + new).
    """
    from ..laws import reference_probs
    from ..rejection import residual_distribution
    if rule not in ("typical", "exact"):
        raise ValueError(f"rule must be 'typical' or 'exact', got {rule!r}")
    ids = input_ids
    end = input_ids.size(1) + max_new_tokens

    def sample(row: torch.Tensor) -> int:
        return int(torch.multinomial(row.float(), 1, generator=generator))

    while ids.size(1) < end:
        drafts, q_rows, ctx = [], [], ids
        for _ in range(num_draft_tokens):
            q = reference_probs(draft(ctx).logits[0, -1], sampling)  # (V,)
            x = sample(q)
            drafts.append(x)
            q_rows.append(q)
            ctx = torch.cat([ctx, torch.tensor([[x]], dtype=ids.dtype)], dim=1)
        p_rows = reference_probs(target(ctx).logits[0, ids.size(1) - 1:], sampling)  # (K + 1, V)
        emitted = []
        for i, x in enumerate(drafts):
            p, q = p_rows[i], q_rows[i]
            if rule == "typical":
                ok = bool(typical_accepts(p, torch.tensor(x)))
                after = p
            else:
                ok = float(torch.rand((), generator=generator, dtype=torch.float64)) < min(1.0, float(p[x] / q[x]))
                after = residual_distribution(p, q) if not ok else p
            if not ok:
                emitted.append(sample(after))
                break
            emitted.append(x)
        else:
            emitted.append(sample(p_rows[len(drafts)]))
        ids = torch.cat([ids, torch.tensor([emitted], dtype=ids.dtype)], dim=1)
    return ids[:, :end]

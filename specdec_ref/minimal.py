"""The whole algorithm in about 30 lines of plain PyTorch (chapter 4).

`speculative_sample` is speculative sampling (Leviathan et al. 2023; Chen et al.
2023) and nothing else: no KV cache (every pass reads the whole sequence again), no
checks of its arguments, no EOS, no device handling, no top-k or top-p, no
statistics, no drafters or schedules. It imports torch and nothing of the package,
so it can be copied out and read alone. The package's
`decoder.speculative_generate` adds all of these around the same four steps.

Invariant: with the same `torch.Generator` it emits the same tokens as
`speculative_generate(..., use_cache=False)` at the same temperature
(tests/test_minimal.py): it computes the distributions as
`sampling.logits_to_probs` does, samples as `sampling.sample` does (inverse CDF,
one uniform per token), draws its random numbers in the package's order (one per
draft, then the block's K uniforms at once, then one for the correction or bonus)
and shrinks K near the budget as the package does. At temperature 0 the
distributions are one-hot and the same rule is greedy decoding: a draft is kept
iff it is the target's argmax.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def speculative_sample(
    target: Callable[[torch.Tensor], torch.Tensor],
    draft: Callable[[torch.Tensor], torch.Tensor],
    ids: torch.Tensor,
    max_new_tokens: int,
    k: int = 4,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Speculative sampling: `ids` and `max_new_tokens` more, as the target's.

    Args:
        target, draft: token ids (L,) -> logits (L, V), one row per position.
        ids: the prompt, shape (n,).
        max_new_tokens: exactly this many tokens are added.
        k: drafts per block (fewer near the end, never past the budget).
        temperature: of both models' softmax; 0 is greedy decoding.
        generator: the only source of randomness.

    Returns:
        The prompt and the new tokens, shape (n + max_new_tokens,).
    """
    def probs(logits):  # the distribution sampled from, (..., V) in float64
        logits = logits.float()
        if temperature == 0:  # greedy: all mass on the first argmax
            first = logits.argmax(-1, keepdim=True)
            return torch.zeros_like(logits).scatter_(-1, first, 1.0).double()
        top = logits.amax(-1, keepdim=True)
        return ((logits - top) / temperature).softmax(-1).double()

    def sample(w):  # inverse CDF: the first token whose mass passes u
        cumulative = w.cumsum(-1)  # (V,)
        u = torch.rand(1, dtype=torch.float64, generator=generator)
        token = torch.searchsorted(cumulative, u * cumulative[-1], right=True)
        return token.clamp(max=w.numel() - 1)  # (1,)

    end = ids.numel() + max_new_tokens
    while ids.numel() < end:
        k_now = min(k, end - ids.numel() - 1)
        # 1. Draft k_now tokens one by one, keeping each distribution q_i.
        drafts, q = ids, []
        for _ in range(k_now):
            q.append(probs(draft(drafts)[-1]))  # (V,)
            drafts = torch.cat([drafts, sample(q[-1])])
        x = drafts[ids.numel():]  # (k_now,)
        # 2. One target pass scores every draft and the bonus: p_0 .. p_k_now.
        p = probs(target(drafts)[-(k_now + 1):])  # (k_now + 1, V)
        # 3. Keep x_i while u_i q_i(x_i) < p_i(x_i): probability min(1, p / q).
        u = torch.rand(k_now, dtype=torch.float64, generator=generator)
        a = 0
        while a < k_now and u[a] * q[a][x[a]] < p[a, x[a]]:
            a += 1
        # 4. A correction from the residual max(0, p - q), or the bonus.
        last = p[a]  # (V,) the bonus token's p_k when all k_now were kept
        if a < k_now:
            last = (p[a] - q[a]).clamp(min=0)
            last = last / last.sum()
        ids = torch.cat([ids, x[:a], sample(last)])
    return ids

"""Verification: one target pass scores all K drafts at once (chapter 3).

A causal transformer computes, in one forward pass over a sequence of length L,
the next-token logits at *every* position. Feed it prefix + K drafts (length n + K)
and read the logits at positions n - 1, n, ..., n + K - 1:

* position n - 1 + i predicts token n + i, i.e. it gives p_i, the target's
  distribution for the i-th draft slot (i = 0 .. K - 1);
* position n + K - 1, the last one, gives p_K: the distribution of the *bonus*
  token that follows when all K drafts are accepted.

So one pass yields K + 1 distributions, shape (K + 1, V), for about the price of
one decoding step when decoding is memory-bound (chapter 1). Each p_i is processed
by the same `logits_to_probs` as the draft's q_i.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .drafting import as_logits_source
from .kv_cache import LogitsSource
from .sampling import SamplingConfig, logits_to_probs


@torch.no_grad()
def target_distributions(
    target_model: PreTrainedModel | LogitsSource,
    input_ids: torch.Tensor,
    draft_tokens: torch.Tensor,
    sampling: SamplingConfig,
) -> torch.Tensor:
    """The target's processed distributions for every draft slot and the bonus.

    Args:
        target_model: the large model, or a `LogitsSource` wrapping it (with a
            cache).
        input_ids: the sequence before the drafts, shape (1, n).
        draft_tokens: the K drafted tokens, shape (K,).
        sampling: the same temperature / top-k / top-p as the draft used.

    Returns:
        p, shape (K + 1, V): p[i] is the target's distribution for draft slot
        i, and p[K] the distribution of the bonus token after all K drafts.
    """
    source = as_logits_source(target_model)
    k = draft_tokens.numel()
    drafts = draft_tokens.view(1, k).to(input_ids.device)  # (1, K)
    sequence = torch.cat([input_ids, drafts], dim=1)  # (1, n + K)
    # One forward pass; keep the logits of the last K + 1 positions
    # (n - 1 .. n + K - 1).
    logits = source.last_logits(sequence, k + 1)  # (K + 1, V)
    return logits_to_probs(logits, sampling)  # (K + 1, V)

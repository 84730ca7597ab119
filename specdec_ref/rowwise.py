"""Row-by-row attention: a verification pass whose rows are bitwise the one-token steps'.

Greedy speculative decoding returns the target's own greedy tokens only if the
verification pass computes, at every position, the logits that a one-token decoding
step computes there. In float32 the two differ by about 1e-5 and an argmax practically
never flips. In bfloat16 a single rounding step is 0.4 %, and a flip at a near-tie
becomes likely: on a CPU, `scaled_dot_product_attention` splits a pass over several
query rows differently from a pass over one, so the same position rounds differently.

`rowwise_attention` (registered with `transformers` as "rowwise_sdpa") computes a
pass over m query rows as m calls of `scaled_dot_product_attention`, row i over the
keys it may see, exactly the call a one-token step at that position makes (a model
switched to it makes every pass this way). The linear layers, norms and rotary
embedding already treat rows independently (with `packed` layers, bitwise), so the
whole pass becomes *batch-invariant*: each row comes out as it would alone. The price
is m - 1 extra kernel calls per layer: on the book's 2-core CPU the tiny target's pass
grows by about 0.1 of a step per drafted token this way, more than eager attention
costs there, whose plain matrix products turn out invariant too
(`tests/test_rowwise.py`); the benchmark's bfloat16 arms use eager attention.

Use: `use_rowwise_attention(model)`, or `--attention rowwise_sdpa` in the benchmark.
Batches of more than one sequence, masks other than the causal one (padding, sliding
windows), position biases and dropout fall back to `transformers`' sdpa attention
(correct, but not row by row).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROWWISE = "rowwise_sdpa"  # the name `transformers` knows this attention by


def rowwise_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of m query rows (1, H, m, d) over L keys (1, H_kv, L, d),
    one row at a time.

    Row i sits at position L - m + i and sees keys 0 .. L - m + i: one
    `scaled_dot_product_attention` call, the same for a one-token step
    there. Returns the output (1, m, H, d) as `transformers`' sdpa
    attention does, and no weights.
    """
    batch, heads, m, _ = query.shape
    length = key.size(2)
    if (batch != 1 or kwargs.get("position_bias") is not None
            or (dropout and module.training)
            or not _only_causal(attention_mask, m, length)):
        # Padding, a window, a bias, training: the library's attention,
        # correct but not row by row.
        return sdpa_attention_forward(module, query, key, value,
                                      attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    grouped = key.size(1) != heads  # grouped-query attention
    rows = []
    for i in range(m):
        end = length - m + i + 1  # the keys row i may see
        rows.append(F.scaled_dot_product_attention(
            query[:, :, i:i + 1], key[:, :, :end], value[:, :, :end],
            scale=scaling, enable_gqa=grouped))  # (1, H, 1, d)
    out = rows[0] if m == 1 else torch.cat(rows, dim=2)  # (1, H, m, d)
    return out.transpose(1, 2).contiguous(), None  # (1, m, H, d)


def _only_causal(mask: torch.Tensor | None, m: int, length: int) -> bool:
    """Whether `mask` (boolean, True: attend; or additive, 0: attend) lets each of the last m
    rows see exactly the keys up to its own position, as no mask at all would."""
    if mask is None:
        return True
    rows = mask.reshape(-1, mask.size(-2), mask.size(-1))[0, -m:, :length]  # (m, L)
    allowed = rows if rows.dtype == torch.bool else rows == 0
    causal = torch.ones(m, length, dtype=torch.bool, device=mask.device).tril(length - m)
    return bool(torch.equal(allowed, causal))


def use_rowwise_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Switch `model` to row-by-row attention, in place; returns it.

    Raises:
        ValueError: if the model cannot choose its attention implementation.
    """
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"{type(model).__name__} has no set_attn_implementation: this transformers "
                         "version cannot switch its attention")
    model.set_attn_implementation(ROWWISE)
    return model


AttentionInterface.register(ROWWISE, rowwise_attention)

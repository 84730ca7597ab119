"""Batch-invariant attention: a verification pass whose rows are bitwise the one-token steps'.

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
grows by about 0.1 of a step per drafted token this way; plain matrix products, as
in eager attention, turn out invariant there too, at a fixed price per pass.

`grouped_attention` (registered as "grouped_eager") is the cheap way to the same end.
It is eager attention, plain matrix products and a float32 softmax, whose rows turn
out batch-invariant on a CPU, as `transformers`' eager attention's do, but it computes
one product per key-value head with the query heads of its group stacked as rows: no
copies of the keys and values for every query head (`repeat_kv`), and no float mask
built for the model on every pass. On the book's CPU a one-token step with it costs
about what one with sdpa attention costs, and less than one with eager attention; the
benchmark's bfloat16 arms run with it. Its invariance is measured, not constructed:
`tests/test_batch_invariant.py` checks it bitwise on the machine that runs the tests.

Use: `use_rowwise_attention(model)` (or `use_rowwise_attention(model, GROUPED)`), or
`--attention rowwise_sdpa` / `grouped_eager` in the benchmark. Both are registered with
`transformers`' sdpa mask function, so a padded batch brings its mask; a batch whose
rows are left-padded (`batched.BatchedForward`, `generate` on padded prompts) is
computed one row at a time, each over its own keys, so every row is bitwise what it
gives alone, whatever the other rows are (`tests/test_batched.py`). A sliding window is
plain causal attention as long as it is at least as long as the keys (Mistral's 4096
over a shorter sequence); a window that hides keys falls back to `transformers`' sdpa
attention (correct, but not row by row), with a warning, as do other masks, position
biases, soft-capping, attention sinks and dropout.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .tree_attention import grouped_tree_attention, tree_plan

ROWWISE = "rowwise_sdpa"  # the names `transformers` knows these attentions by
GROUPED = "grouped_eager"
# Keyword arguments that ask for more than causal attention: they fall back to sdpa.
# (A sliding window does only when it is shorter than the keys: `_window_hides_nothing`.)
_EXTRAS = ("position_bias", "softcap", "s_aux")


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
    starts = _row_starts(module, query, key, attention_mask, dropout, kwargs)
    if starts is None:
        return sdpa_attention_forward(module, query, key, value,
                                      attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    if len(starts) > 1:  # a padded batch: each row alone, over its own keys
        return _row_by_row(rowwise_attention, module, query, key, value,
                           starts, scaling)
    heads, m, length = query.size(1), query.size(2), key.size(2)
    grouped = key.size(1) != heads  # grouped-query attention
    rows = []
    for i in range(m):
        end = length - m + i + 1  # the keys row i may see
        rows.append(F.scaled_dot_product_attention(
            query[:, :, i:i + 1], key[:, :, :end], value[:, :, :end],
            scale=scaling, enable_gqa=grouped))  # (1, H, 1, d)
    out = rows[0] if m == 1 else torch.cat(rows, dim=2)  # (1, H, m, d)
    return out.transpose(1, 2).contiguous(), None  # (1, m, H, d)


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Eager attention of m query rows (1, H, m, d) over L keys (1, H_kv, L, d),
    one matrix product per key-value head.

    The H / H_kv query heads that share a key-value head are stacked as
    rows: (H_kv, H / H_kv * m, d) against (H_kv, d, L). Row i sits at
    position L - m + i and sees keys 0 .. L - m + i; under a tree's mask,
    each row sees its own keys, as a step there (`tree_attention`).
    Returns the output (1, m, H, d) and no weights.
    """
    starts = _row_starts(module, query, key, attention_mask, dropout, kwargs)
    if starts is None:
        # A tree of drafts (`tree_forward`): each node's row as a step there.
        plan = _tree(module, query, key, attention_mask, dropout, kwargs)
        if plan is not None:
            out = grouped_tree_attention(query, key, value, plan, scaling)
            return out, None
        return sdpa_attention_forward(module, query, key, value,
                                      attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    if len(starts) > 1:  # a padded batch: each row alone, over its own keys
        return _row_by_row(grouped_attention, module, query, key, value,
                           starts, scaling)
    _, heads, m, dim = query.shape
    kv_heads, length = key.size(1), key.size(2)
    scale = dim ** -0.5 if scaling is None else scaling
    rows = query.reshape(kv_heads, heads // kv_heads * m, dim)
    scores = torch.matmul(rows, key[0].transpose(1, 2)) * scale  # (H_kv, ., L)
    if m > 1:  # row i may not see the keys after position L - m + i
        hidden = _future(m, length, query.device)  # (m, L)
        scores = scores.view(heads, m, length).masked_fill(hidden, -math.inf)
    weights = scores.float().softmax(-1).to(value.dtype)
    out = torch.matmul(weights.view(kv_heads, -1, length), value[0])
    return out.view(heads, m, dim).transpose(0, 1)[None].contiguous(), None


def _row_starts(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                mask: torch.Tensor | None, dropout: float, kwargs: dict) -> list[int] | None:
    """The key column where each row's tokens start, when a call is what both attentions
    here compute: plain causal attention, over one sequence ([0]) or a batch whose rows
    are left-padded (`_padded_starts`). None: padding of another shape, a window that
    hides keys, a bias, soft-capping, sinks, uneven head groups or dropout in training,
    which go to the library's sdpa attention (correct, not row by row)."""
    batch, m = query.size(0), query.size(2)
    if not _plain(module, query, key, dropout, kwargs):
        return None
    if batch == 1:
        return [0] if _only_causal(mask, m, key.size(2)) else None
    return _padded_starts(mask, batch, m, key.size(2))


def _plain(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, dropout: float,
           kwargs: dict) -> bool:
    """Whether a call asks for no more than masked attention: even head groups, no
    dropout in training, no bias, soft-capping or sinks, no window that hides keys."""
    return (query.size(1) % key.size(1) == 0 and not (dropout and module.training)
            and all(kwargs.get(name) is None for name in _EXTRAS)
            and _window_hides_nothing(kwargs.get("sliding_window"), key.size(2)))


def _tree(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
          dropout: float, kwargs: dict):
    """`tree_attention.tree_plan` of one sequence's mask, when the call asks for no more than
    masked attention (None otherwise, or for a mask that is not a tree's)."""
    if query.size(0) != 1 or mask is None or not _plain(module, query, key, dropout, kwargs):
        return None
    return tree_plan(mask, query.size(2), key.size(2))


_PADDED: list = [None, None]  # the last padded mask read, and its rows' starts


def _padded_starts(mask: torch.Tensor | None, batch: int, m: int, length: int) -> list[int] | None:
    """Row b's first key column s_b when `mask` (B, 1, m, L) is causal with each row's
    first s_b columns hidden (left padding); None for any other mask. Query rows that
    sit on padding themselves are not read. One device sync per pass, not per layer."""
    if mask is None:
        return [0] * batch
    if mask is _PADDED[0]:
        return _PADDED[1]
    allowed = mask.reshape(batch, -1, mask.size(-2), mask.size(-1))[:, 0, -m:, :length]  # (B, m, L)
    allowed = allowed if allowed.dtype == torch.bool else allowed == 0
    starts = length - allowed[:, -1].sum(-1)  # (B,) the last row sees every unpadded key
    columns = torch.arange(length, device=mask.device)
    expected = ~_future(m, length, mask.device)[None] & (columns >= starts[:, None])[:, None]  # (B, m, L)
    real = (length - m + torch.arange(m, device=mask.device))[None] >= starts[:, None]  # (B, m)
    if bool(((allowed != expected) & real[..., None]).any()):
        return None
    _PADDED[:] = [mask, starts.tolist()]
    return _PADDED[1]


def _row_by_row(attention, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, starts: list[int], scaling: float | None) -> tuple[torch.Tensor, None]:
    """`attention` of each row of a left-padded batch alone: its unpadded queries over its
    unpadded keys (contiguous, as one sequence's cache holds them), so every row is
    bitwise what that row gives alone; padded queries get zeros. Output (B, m, H, d)."""
    m, length = query.size(2), key.size(2)
    rows = []
    for b, start in enumerate(starts):
        real = min(m, length - start)  # the row's queries that are tokens, not padding
        out, _ = attention(module, query[b:b + 1, :, m - real:], key[b:b + 1, :, start:].contiguous(),
                           value[b:b + 1, :, start:].contiguous(), None, scaling=scaling)  # (1, real, H, d)
        rows.append(out if real == m else torch.cat([out.new_zeros(1, m - real, *out.shape[2:]), out], 1))
    return torch.cat(rows), None


def _window_hides_nothing(window: int | None, length: int) -> bool:
    """Whether a sliding window (a query sees itself and the window - 1 keys before it)
    leaves every one of the L keys visible, so attention is plain causal; when it does
    not, warn that the pass falls back to sdpa (correct, not row by row)."""
    if window is None or window >= length:
        return True
    warnings.warn(f"sliding_window={window} hides some of the {length} keys: this attention falls back to "
                  "sdpa, which keeps the window but not bitwise batch invariance", UserWarning, stacklevel=3)
    return False


_FUTURE: dict = {}  # the last mask built: every layer of a pass asks for the same one


def _future(m: int, length: int, device: torch.device) -> torch.Tensor:
    """(m, L) boolean: True where row i (at position L - m + i) must not look."""
    key = (m, length, device, torch.is_inference_mode_enabled())  # inference tensors stay there
    if key not in _FUTURE:
        _FUTURE.clear()
        _FUTURE[key] = torch.ones(m, length, dtype=torch.bool, device=device).triu(length - m + 1)
    return _FUTURE[key]


_CHECKED: list = [None]  # the last mask found causal: every layer of a pass gets the same one


def _only_causal(mask: torch.Tensor | None, m: int, length: int) -> bool:
    """Whether `mask` (boolean, True: attend; or additive, 0: attend) lets each of the last m
    rows see exactly the keys up to its own position, as no mask at all would."""
    if mask is None:
        return True
    if mask is _CHECKED[0]:  # transformers builds a fresh mask for every pass
        return True
    rows = mask.reshape(-1, mask.size(-2), mask.size(-1))[0, -m:, :length]  # (m, L)
    allowed = rows if rows.dtype == torch.bool else rows == 0
    causal = ~_future(m, length, mask.device)
    if not torch.equal(allowed, causal):
        return False
    _CHECKED[0] = mask  # checked once per pass, not once per layer
    return True


def use_rowwise_attention(model: PreTrainedModel, attention: str = ROWWISE) -> PreTrainedModel:
    """Switch `model` to row-by-row attention (ROWWISE) or to grouped eager
    attention (GROUPED), in place; returns it.

    Raises:
        ValueError: if `attention` is neither, or the model cannot choose its attention.
    """
    if attention not in (ROWWISE, GROUPED):
        raise ValueError(f"attention must be {ROWWISE!r} or {GROUPED!r}, got {attention!r}")
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"{type(model).__name__} has no set_attn_implementation: this transformers "
                         "version cannot switch its attention")
    model.set_attn_implementation(attention)
    return model


for _name, _function in ((ROWWISE, rowwise_attention), (GROUPED, grouped_attention)):
    AttentionInterface.register(_name, _function)
    AttentionMaskInterface.register(_name, sdpa_mask)  # padding masks still reach the fallback

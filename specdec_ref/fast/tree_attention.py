"""Tree attention whose rows are bitwise the one-token steps' (for `grouped_attention`).

A tree of drafts (`tree_forward`) goes through the target in one pass with a mask:
each node sees the committed tokens and its own ancestors. Computed as one product
over every key with the others masked out, a node's row sums the same terms as a
one-token step at that node would, but with the hidden keys' zeros in between, so
the sums are grouped differently and round differently: in bfloat16 a greedy
argmax at a near-tie can flip, and the tree decoder no longer returns the target's
own greedy tokens.

So each row is computed as a step computes it, over the keys the step holds. Every
row gathers the keys and values it may see, in order (the committed tokens, its
ancestors, itself: what a step at that node has in its cache, contiguous), and the
rows are stacked as a batch, one product per (row, key-value head) as a step makes
one per key-value head. The rows see different numbers of keys: the shorter ones
are padded at the end with hidden keys, as a chain's verification rows are (row i
of `grouped_attention` hides the keys after its own), and that leaves their sums as
a step's. `tests/test_tree_fast.py` checks the rows bitwise against steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class TreePlan:
    """How the rows of one tree-masked pass are computed."""

    keys: torch.Tensor  # (m, C) the keys each row sees, in order, then padding
    padding: torch.Tensor  # (m, C) True where `keys` is padding (a key the row may not see)


_PLAN: list = [None, None]  # the last mask read and its plan: every layer gets the same mask


def tree_plan(mask: torch.Tensor, m: int, length: int) -> TreePlan | None:
    """The plan for a (1, 1, m, L) mask (boolean, True: attend; or additive,
    0: attend) in which every row sees its own key and none after it; None
    for any other mask."""
    if mask is _PLAN[0]:
        return _PLAN[1]
    if mask.dim() != 4 or mask.size(0) != 1 or mask.size(1) != 1 or mask.size(-1) < length:
        return None
    allowed = mask[0, 0, -m:, :length].cpu()  # (m, L)
    allowed = allowed if allowed.dtype == torch.bool else allowed == 0
    own = length - m + torch.arange(m)  # each row's own key column
    columns = torch.arange(length)
    if not bool(allowed[torch.arange(m), own].all()) or bool((allowed & (columns > own[:, None])).any()):
        return None
    counts = allowed.sum(-1)  # (m,) keys each row sees
    width = int(counts.max())
    # Row i's visible columns, left-aligned and in order (a stable sort), then hidden ones:
    # padding whose weights come out 0, written back where they change nothing.
    order = torch.sort((~allowed).to(torch.uint8), dim=-1, stable=True).indices[:, :width]  # (m, C)
    padding = torch.arange(width)[None] >= counts[:, None]  # (m, C)
    plan = TreePlan(order.to(mask.device), padding.to(mask.device))
    _PLAN[:] = [mask, plan]
    return plan


def grouped_tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           plan: TreePlan, scaling: float | None) -> torch.Tensor:
    """Attention of a tree's m rows (1, H, m, d) over L keys (1, H_kv, L, d) by
    `plan`. Returns (1, m, H, d)."""
    _, heads, m, dim = query.shape
    kv_heads, length = key.size(1), key.size(2)
    scale = dim ** -0.5 if scaling is None else scaling
    # Scores of every row against every key, as a chain's verification makes them.
    rows = query.reshape(kv_heads, heads // kv_heads * m, dim)
    scores = torch.matmul(rows, key[0].transpose(1, 2)) * scale  # (H_kv, ., L)
    # Each row's visible scores, left-aligned and in order, padding hidden: a step's softmax.
    index = plan.keys[None].expand(heads, -1, -1)  # (H, m, C)
    seen = scores.view(heads, m, length).gather(-1, index).masked_fill(plan.padding, -math.inf)
    seen = seen.float().softmax(-1).to(value.dtype)  # (H, m, C), 0 on padding
    # Back in place, zeros where a row may not look: the products sum what a step's sum.
    weights = seen.new_zeros(heads, m, length).scatter_(-1, index, seen)
    out = torch.matmul(weights.view(kv_heads, -1, length), value[0])
    return out.view(heads, m, dim).transpose(0, 1)[None].contiguous()  # (1, m, H, d)

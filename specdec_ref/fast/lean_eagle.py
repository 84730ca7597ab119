"""EAGLE's head without the framework's per-call work: the fast path's drafter (chapter 10).

An EAGLE draft pass is small arithmetic: two norms, the fusing layer, one decoder layer,
the target's LM head. Through `transformers` most of its time is per-call work (masks,
rotary embeddings computed per call, cache objects, a dozen module calls), as for the
separate draft that `fast.LeanForward` runs lean. `LeanEagle` runs the same weights
through the same arithmetic as `fast.blocks` runs the draft's: the head's layer as
`blocks.llama_block`, its rotary rows computed once for every position by the head's own
rotary module, its keys and values in one preallocated buffer per cache (`LeanCache`)
whose crop only lowers a length.

It is a drop-in head for `drafters.EagleDrafter`: same call (embeddings, features,
positions, cache) and the same cache methods the stable cache uses
(`get_seq_length`, `crop`), so `EagleDrafter(LeanEagle(head), source)` drafts exactly as
`EagleDrafter(head, source)` up to float rounding (`tests/test_lean_eagle.py`: below
1e-5 in float32). Chains only: a tree's mask (`allowed`) goes through `EagleHead`.
Invariant: a pass at positions p..p+m-1 writes cache slots p..p+m-1 and sees slots
0..p+m-1 causally, as the `DynamicCache` pass it replaces does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..heads.eagle import EagleHead
from .blocks import llama_block, signed_sin

DEFAULT_MAX_LENGTH = 4096  # cache slots when the head's config allows more positions


class LeanCache:
    """The lean head's keys and values: (H_kv, P, d) buffers and the length in use."""

    def __init__(self, kv_heads: int, max_length: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.keys = torch.zeros(kv_heads, max_length, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.length = 0  # slots 0..length - 1 hold positions 0..length - 1

    def get_seq_length(self) -> int:
        """Positions held (`DynamicCache`'s name for it)."""
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions; a negative value drops that many from
        the end (`DynamicCache.crop`'s rule). The dropped slots are overwritten later."""
        kept = self.length + max_length if max_length < 0 else max_length
        self.length = max(0, min(self.length, kept))


class LeanEagle:
    """An `EagleHead` run lean: `head(embeds, features, position_ids, cache)` -> (1, m, H)."""

    def __init__(self, head: EagleHead, max_length: int | None = None) -> None:
        if not isinstance(head, EagleHead):
            raise TypeError(f"head must be a heads.eagle.EagleHead, got {type(head).__name__}")
        config = head.config
        self.head, self.config, self.fc = head, config, head.fc  # `fc`: the drafter reads its dtype
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        limit = getattr(config, "max_position_embeddings", DEFAULT_MAX_LENGTH)
        self.max_length = max_length or min(limit, DEFAULT_MAX_LENGTH)
        weight = head.fc.weight
        with torch.no_grad():  # the rotary rows of every position, once
            ids = torch.arange(self.max_length, device=weight.device)[None]  # (1, P)
            cos, sin = head.rotary(weight[:1][None], ids)  # (1, P, d) each
        self.block = llama_block(head.layer, cos[0], signed_sin(sin[0]), self.heads, self.kv_heads,
                                 self.head_dim)
        self.scale = getattr(head.layer.self_attn, "scaling", self.head_dim ** -0.5)

    def new_cache(self) -> LeanCache:
        """An empty cache for the head's one layer."""
        weight = self.fc.weight
        return LeanCache(self.kv_heads, self.max_length, self.head_dim, weight.dtype, weight.device)

    @torch.no_grad()
    def __call__(self, embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
                 cache: LeanCache, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted features (1, m, H) from embeddings and features (1, m, H) at
        `position_ids` (1, m), which must continue the cache: p, p + 1, ... with p its length.

        Raises:
            ValueError: for a tree's mask, a batch, positions that do not continue the
                cache, or positions past `max_length`.
        """
        if allowed is not None:
            raise ValueError("LeanEagle drafts chains: pass a tree's mask to EagleHead itself")
        if embeds.size(0) != 1:
            raise ValueError(f"LeanEagle takes one sequence, got a batch of {embeds.size(0)}")
        start, m = cache.length, embeds.size(1)
        positions = position_ids[0]  # (m,)
        if int(positions[0]) != start or int(positions[-1]) != start + m - 1:
            raise ValueError(f"position_ids must continue the cache ({start}..{start + m - 1}), "
                             f"got {positions.tolist()}")
        if start + m > self.max_length:
            raise ValueError(f"the head's cache holds {self.max_length} positions; this pass needs "
                             f"{start + m}: build LeanEagle with a larger max_length")
        head = self.head
        x = self.fc(torch.cat([head.embed_norm(embeds[0]), head.feature_norm(features[0])], -1))  # (m, H)
        width = start + m
        # A one-row pass sees every cached slot; several rows see the cache and the rows
        # up to themselves (causal, aligned to the bottom right).
        mask = None if m == 1 else (torch.arange(width, device=x.device)[None] <= positions[:, None])

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            cache.keys[:, start:width], cache.values[:, start:width] = k, v  # (H_kv, m, d)
            out = F.scaled_dot_product_attention(
                q[None], cache.keys[None, :, :width], cache.values[None, :, :width], attn_mask=mask,
                scale=self.scale, enable_gqa=self.kv_heads != self.heads)  # (1, H, m, d)
            return out[0].transpose(0, 1).reshape(m, -1)  # (m, H * d)

        x = self.block(x, positions, attend)  # (m, H)
        cache.length = width
        return x[None]  # (1, m, H)

"""A causal LM's decoder blocks as plain functions of (tokens, positions), family by family.

`static.StaticForward` runs a model through its own preallocated KV cache, with every
shape fixed, so that a GPU can capture a pass as a CUDA graph. It needs the model's
arithmetic in pieces it can call with its own attention: embed the new tokens, run
each block with an attention function it supplies, and apply the head. This module
takes those pieces from a loaded `transformers` model, reading its own modules and
weight tensors (nothing is copied, so prepacked layers stay prepacked):

* GPT-2 (`gpt2`): learned position embeddings, LayerNorm, one fused q/k/v projection,
  GELU MLP; the article's pair (gpt2 -> gpt2-xl) is of this family;
* Llama-style (`llama`, `qwen2`): rotary position embeddings, RMSNorm, separate q/k/v
  projections (biases allowed), grouped-query attention, gated MLP; the tiny pair is
  of this family.

Each block computes exactly what the `transformers` module computes (the same norms,
projections, activations and attention scale), so the logits agree with
`kv_cache.CachedForward`'s up to float rounding (`tests/test_fast.py`). Anything this
module cannot reproduce (cross-attention, sliding windows, rope scalings whose tables
depend on the sequence length) is refused with a `ValueError` that names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..kv_cache import uses_sliding_window
from ..validation import check_sequence

# attend(q (H, m, d), k (H_kv, m, d), v (H_kv, m, d)) -> (m, H * d): attention of the m
# new tokens over the cached ones and themselves; the caller owns the cache.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# block(x (m, D), positions (m,) or a slice of them, attend) -> x (m, D)
Block = Callable[[torch.Tensor, torch.Tensor | slice, Attend], torch.Tensor]

FAMILIES = ("gpt2", "llama", "qwen2")
# Rope types whose cos / sin rows change with the sequence length: a table computed
# once cannot reproduce them.
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass
class ModelBlocks:
    """A model cut into the pieces a static-cache forward pass calls."""

    embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids (m,), positions (m,)) -> (m, D)
    blocks: list[Block]  # one per decoder layer, in order
    head: Callable[[torch.Tensor], torch.Tensor]  # final norm and output layer: (m, D) -> (m, V)
    heads: int  # H, query heads
    kv_heads: int  # H_kv, key / value heads (H_kv divides H)
    head_dim: int  # d
    scales: list[float]  # the attention scale of each layer (1 / sqrt(d) unless the config says otherwise)
    max_positions: int  # the most positions the model's position embeddings cover


def static_unsupported(model: PreTrainedModel) -> str | None:
    """Why `model_blocks` cannot cut `model` (None when it can)."""
    config = model.config
    if config.model_type not in FAMILIES:
        return f"model type {config.model_type!r} is not one of {FAMILIES}"
    if model.training:
        return "the model is in training mode (call .eval() first)"
    if getattr(config, "add_cross_attention", False):
        return "the model has cross-attention layers"
    if uses_sliding_window(config):
        return "some layers use sliding-window attention"
    if config.model_type != "gpt2":
        return length_dependent_rope(model)
    return None


def length_dependent_rope(model: PreTrainedModel) -> str | None:
    """Why a rotary table computed once is wrong for `model` ("dynamic", "longrope": cos / sin
    rows that change as the sequence grows), or None. `lean.LeanForward` is this path too."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    if any(kind in str(rope_type) for kind in _LENGTH_DEPENDENT_ROPE):
        return f"rope type {rope_type!r} depends on the sequence length"
    return None


def model_blocks(model: PreTrainedModel, num_positions: int) -> ModelBlocks:
    """Cut `model` into embed / blocks / head, with rotary tables for `num_positions` positions.

    Raises:
        ValueError: if the model is not supported (`static_unsupported` says why).
    """
    reason = static_unsupported(model)
    if reason is not None:
        raise ValueError(f"the static-cache path cannot run {type(model).__name__}: {reason}")
    if model.config.model_type == "gpt2":
        return _gpt2_blocks(model)
    return _llama_blocks(model, num_positions)


def _split_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """(m, heads * d) -> (heads, m, d)."""
    return x.view(x.size(0), heads, head_dim).transpose(0, 1)


def _gpt2_blocks(model: PreTrainedModel) -> ModelBlocks:
    """GPT-2: x = wte[ids] + wpe[positions]; per block LayerNorm, fused q/k/v, GELU MLP."""
    config, body = model.config, model.transformer
    heads, width = config.n_head, config.n_embd
    head_dim = width // heads
    limit = config.n_positions

    def embed(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Positions past the table only occur in the scratch columns a graph is captured
        # on (static.StaticForward); real positions are checked against max_length first.
        return body.wte.forward(ids) + body.wpe.forward(positions.clamp(max=limit - 1))  # (m, D)

    def block_of(layer: torch.nn.Module) -> Block:
        attention, mlp = layer.attn, layer.mlp

        def block(x: torch.Tensor, positions: torch.Tensor | slice, attend: Attend) -> torch.Tensor:
            q, k, v = attention.c_attn.forward(layer.ln_1.forward(x)).split(width, dim=-1)  # (m, D) each
            out = attend(_split_heads(q, heads, head_dim), _split_heads(k, heads, head_dim),
                         _split_heads(v, heads, head_dim))  # (m, D)
            x = x + attention.c_proj.forward(out)
            return x + mlp.c_proj.forward(mlp.act(mlp.c_fc.forward(layer.ln_2.forward(x))))

        return block

    def head(x: torch.Tensor) -> torch.Tensor:
        return model.lm_head.forward(body.ln_f.forward(x))  # (m, V)

    # GPT-2's attention scale: 1 / sqrt(d) (scale_attn_weights), divided by the layer's
    # number (from 1) when scale_attn_by_inverse_layer_idx is set.
    base = 1 / math.sqrt(head_dim) if config.scale_attn_weights else 1.0
    scales = [base / (i + 1) if config.scale_attn_by_inverse_layer_idx else base for i in range(config.n_layer)]
    return ModelBlocks(embed, [block_of(layer) for layer in body.h], head, heads, heads, head_dim, scales, limit)


def check_pass(sequence: torch.Tensor, seen: int, num_positions: int, max_length: int,
               owner: str) -> int:
    """The input of a cached pass (`static.StaticForward`): a (1, n) sequence whose tokens past
    the `seen` cached ones include the last `num_positions` >= 1, with n <= max_length.

    Returns:
        n, the sequence's length.

    Raises:
        ValueError: naming num_positions or max_length (and `owner`, the class to rebuild).
    """
    check_sequence(sequence)
    end = sequence.size(1)
    if not 1 <= num_positions <= end - seen:
        raise ValueError(f"num_positions={num_positions} but {end - seen} tokens are unseen (the cache holds "
                         f"{seen} of {end}); it must be between 1 and the unseen count: call rollback() first")
    if end > max_length:
        raise ValueError(f"the sequence has {end} tokens, more than max_length={max_length}; "
                         f"build a {owner} with a larger max_length")
    return end


def rotary_rows(model: PreTrainedModel, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin rows (P, d) of every position of a Llama-style model, from its own rotary
    module (so its rope scaling is honoured), computed once for `static.StaticForward`;
    the sin rows' first half is negated, as `rotate` takes them."""
    weight = model.model.embed_tokens.weight
    with torch.no_grad():
        ids = torch.arange(num_positions, device=weight.device)[None]  # (1, P)
        cos, sin = model.model.rotary_emb(weight[:1][None], ids)  # (1, P, d) each
    return cos[0], signed_sin(sin[0])  # (P, d) each


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin rows (P, d) with their first half negated, as `rotate` takes them."""
    half = sin.size(-1) // 2
    return torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x (heads, m, d) with cos / sin rows (m, d), the sin
    rows' first half negated: x * cos + [-x2, x1] * sin, with the sign moved into sin."""
    return x * cos + x.roll(x.size(-1) // 2, dims=-1) * signed_sin


def _rms_norm(norm: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A Llama-style RMSNorm module as a function, computed as `transformers` does: in
    float32, scaled in the input dtype."""
    weight, eps = norm.weight, norm.variance_epsilon

    def apply(x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)  # (m, 1)
        return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)

    return apply


def llama_block(layer: torch.nn.Module, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                head_dim: int) -> Block:
    """One Llama-style decoder layer as a function of (x, positions, attend): RMSNorm,
    rotary q / k from the rows cos / sin (P, d, sin signed for `rotate`), attention by
    `attend`, RMSNorm, gated MLP (also the EAGLE head's layer, `fast.lean_eagle`)."""
    attention, mlp = layer.self_attn, layer.mlp
    norm1, norm2 = _rms_norm(layer.input_layernorm), _rms_norm(layer.post_attention_layernorm)
    # The linear layers' own `forward` methods, looked up once: a pass makes no module calls.
    q_proj, k_proj, v_proj, o_proj = (attention.q_proj.forward, attention.k_proj.forward,
                                      attention.v_proj.forward, attention.o_proj.forward)
    gate, up, down, act = mlp.gate_proj.forward, mlp.up_proj.forward, mlp.down_proj.forward, mlp.act_fn.forward

    def block(x: torch.Tensor, positions: torch.Tensor | slice, attend: Attend) -> torch.Tensor:
        h = norm1(x)  # (m, D)
        cos_rows, sin_rows = cos[positions], sin[positions]  # (m, d)
        q = rotate(_split_heads(q_proj(h), heads, head_dim), cos_rows, sin_rows)
        k = rotate(_split_heads(k_proj(h), kv_heads, head_dim), cos_rows, sin_rows)
        v = _split_heads(v_proj(h), kv_heads, head_dim)
        x = x + o_proj(attend(q, k, v))
        h = norm2(x)
        return x + down(act(gate(h)) * up(h))

    return block


def _llama_blocks(model: PreTrainedModel, num_positions: int) -> ModelBlocks:
    """Llama-style: x = embed[ids]; per block RMSNorm, rotary q/k, grouped-query attention, gated MLP."""
    config, body = model.config, model.model
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    cos, sin = rotary_rows(model, num_positions)  # (P, d) each, sin signed for `rotate`
    table, norm, lm_head = body.embed_tokens.weight, _rms_norm(body.norm), model.get_output_embeddings().forward

    def embed(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return table[ids]  # (m, D); positions enter through the rotary rows

    def block_of(layer: torch.nn.Module) -> Block:
        return llama_block(layer, cos, sin, heads, kv_heads, head_dim)

    def head(x: torch.Tensor) -> torch.Tensor:
        return lm_head(norm(x))  # (m, V)

    scale = getattr(body.layers[0].self_attn, "scaling", head_dim ** -0.5)
    blocks = [block_of(layer) for layer in body.layers]
    return ModelBlocks(embed, blocks, head, heads, kv_heads, head_dim, [scale] * len(blocks), num_positions)

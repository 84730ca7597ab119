"""A lean cached forward pass for a small Llama-style draft model (chapter 6's cost c).

The draft's job is to be cheap: speculative decoding pays when c = tau_q / tau_p is
small. A one-layer draft does little arithmetic, so its time per token is mostly
per-call overhead: a `transformers` forward builds attention masks, position
embeddings and cache objects, and walks a dozen Python modules, for a pass whose
matrix products take a fraction of a millisecond on a CPU. `LeanForward` runs the
same weights through the same arithmetic with none of that:

* the keys and values live in one preallocated buffer per layer, (H_kv, P, d), so a
  pass writes its new columns in place and `rollback(n)` only lowers a length;
* the rotary cos / sin rows for every position are computed once, by the model's own
  rotary-embedding module (so any rope scaling whose rows do not depend on the
  sequence length is honoured);
* each block is RMSNorm, attention (`scaled_dot_product_attention`, grouped-query
  when H_kv < H), RMSNorm, SwiGLU, read from the model's own weight tensors; the
  linear layers are called through the model's own layers' `forward`, so a draft
  prepacked by `packed.pack_linear_layers` runs its oneDNN kernels here too, which
  on a CPU in bfloat16 beat plain `F.linear` (`packed`'s docstring; the benchmark
  report `specdec_ref/data/bench-tiny-cpu.json` compares with and without).

It answers the `kv_cache.LogitsSource` question ("logits of the last m positions of
this sequence") and plugs into the decoder as a drafter:
`speculative_generate(target, ModelDrafter(LeanForward(draft), sampling, generator),
ids, ...)`.

Invariant: its logits equal `kv_cache.CachedForward`'s on the same model up to float
rounding (`tests/test_lean.py`: below 1e-5 in float32 across passes and rollbacks).
Only the draft's speed changes: the decoder's output law depends on the q it was
given, never on how q was computed, and the target still runs through `transformers`.
Supported: Llama-style models (model types in `LEAN_MODEL_TYPES`) with SiLU MLPs, full
attention and a rotary table that does not depend on the sequence length (not "dynamic"
or "longrope", whose rows past max_position_embeddings change as the sequence grows: the
rule of `fast.static_unsupported`); anything else raises a `ValueError` naming what is not supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..kv_cache import uses_sliding_window
from ..timing import time_call
from ..validation import check_integer, model_device, vocab_size
from .blocks import check_pass, length_dependent_rope, rotary_rows, rotate

# Model types whose decoder block is exactly: RMSNorm, rotary attention (optional
# q/k/v biases), RMSNorm, SwiGLU MLP.
LEAN_MODEL_TYPES = ("llama", "qwen2")


def lean_unsupported(model: PreTrainedModel) -> str | None:
    """Why `LeanForward` cannot run `model` (None when it can)."""
    config = model.config
    if config.model_type not in LEAN_MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {LEAN_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not 'silu'"
    if getattr(config, "mlp_bias", False):
        return "the MLP has biases"
    if uses_sliding_window(config):
        return "some layers use sliding-window attention"
    return length_dependent_rope(model)  # the rotary table is computed once, as in `fast`


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as `transformers` computes it: in float32, scaled in the input dtype."""
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


class LeanForward:
    """A Llama-style model's cached forward pass with no per-call framework overhead."""

    def __init__(self, model: PreTrainedModel, max_length: int | None = None) -> None:
        """Args:
            model: a Llama-style causal LM (`LEAN_MODEL_TYPES`), in eval mode.
            max_length: the most tokens a sequence may reach (default: the model's
                max_position_embeddings).

        Raises:
            ValueError: if the model is not supported, or `max_length` is not >= 1.
        """
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"LeanForward cannot run {type(model).__name__}: {reason}; use CachedForward")
        config = model.config
        positions = config.max_position_embeddings if max_length is None else max_length
        positions = check_integer("max_length", positions, minimum=1)
        self.model = model
        self.forward_calls = 0
        self.length = 0  # tokens whose keys and values are in the buffers
        self.max_length = positions
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        body = model.model
        self.embed = body.embed_tokens.weight  # (V, D)
        self.blocks = [_block_weights(layer) for layer in body.layers]
        self.norm = body.norm.weight
        self.head = model.get_output_embeddings().forward  # (m, D) -> (m, V)
        weight = self.embed
        shape = (self.kv_heads, positions, self.head_dim)
        self.keys = [weight.new_zeros(shape) for _ in self.blocks]
        self.values = [weight.new_zeros(shape) for _ in self.blocks]
        self.cos, self.sin = rotary_rows(model, positions)  # (P, d) each, as `static`'s

    @torch.no_grad()
    def last_logits(self, sequence: torch.Tensor, num_positions: int) -> torch.Tensor:
        """Logits at the last `num_positions` positions: (1, n) -> (m, V).

        Feeds only the tokens past `length`, which must include the last
        `num_positions` positions (as `CachedForward.last_logits`).
        """
        seen = self.length
        end = check_pass(sequence, seen, num_positions, self.max_length, "LeanForward")
        m = end - seen
        # New token i (at position seen + i) sees the keys at positions <= seen + i.
        mask = None
        if m > 1:
            mask = torch.ones(m, end, dtype=torch.bool, device=sequence.device).tril(seen)  # (m, end)
        return self._run(sequence[0, seen:], slice(seen, end), mask, num_positions)

    @torch.no_grad()
    def tree_logits(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                    num_positions: int) -> torch.Tensor:
        """Logits of the last `num_positions` of m new tokens fed after the cached ones,
        each at its own position id, each seeing the keys `mask` allows (a tree of
        drafts: `tree_forward`).

        Args:
            ids: the new tokens, (m,); they take cache slots length .. length + m - 1.
            positions: their position ids, (m,) (their rotary rows).
            mask: (m, length + m) boolean, True where a row may attend (None: every key).
            num_positions: rows whose logits are returned (the last ones).
        """
        end = self.length + ids.size(0)
        if end > self.max_length:
            raise ValueError(f"the cache would hold {end} entries, more than max_length={self.max_length}")
        return self._run(ids, positions, mask, num_positions)

    def keep(self, slots: list[int]) -> None:
        """Keep only these cache entries (ascending), moved to slots 0 .. len(slots) - 1."""
        slots = [s for s in slots if s < self.length]
        start = next((i for i, s in enumerate(slots) if s != i), len(slots))  # a kept prefix stays
        if start < len(slots):
            index = torch.tensor(slots[start:], device=self.embed.device)
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[:, start:len(slots)] = keys.index_select(1, index)  # (H_kv, kept, d)
                values[:, start:len(slots)] = values.index_select(1, index)
        self.length = len(slots)

    def _run(self, ids: torch.Tensor, positions: torch.Tensor | slice, mask: torch.Tensor | None,
             num_positions: int) -> torch.Tensor:
        """One pass of m new tokens (m,) at `positions` ((m,) or a slice), written after the cached ones."""
        seen = self.length
        end = seen + ids.size(0)
        x = self.embed[ids]  # (m, D)
        cos, sin = self.cos[positions], self.sin[positions]  # (m, d)
        for block, keys, values in zip(self.blocks, self.keys, self.values, strict=True):
            x = x + self._attention(block, _rms_norm(x, block["norm1"], self.eps), keys, values,
                                    cos, sin, seen, end, mask)
            h = _rms_norm(x, block["norm2"], self.eps)
            x = x + block["down"](F.silu(block["gate"](h)) * block["up"](h))
        x = _rms_norm(x[-num_positions:], self.norm, self.eps)
        self.length = end
        self.forward_calls += 1
        return self.head(x)  # (num_positions, V)

    def _attention(self, block: dict, h: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, seen: int, end: int,
                   mask: torch.Tensor | None) -> torch.Tensor:
        """One attention sublayer for the m new tokens h (m, D); writes their keys and values."""
        m = h.size(0)
        q = block["q"](h).view(m, self.heads, self.head_dim).transpose(0, 1)
        k = block["k"](h).view(m, self.kv_heads, self.head_dim).transpose(0, 1)
        v = block["v"](h).view(m, self.kv_heads, self.head_dim).transpose(0, 1)
        keys[:, seen:end] = rotate(k, cos, sin)  # (H_kv, m, d) written in place
        values[:, seen:end] = v
        out = F.scaled_dot_product_attention(
            rotate(q, cos, sin)[None], keys[None, :, :end], values[None, :, :end],
            attn_mask=mask, enable_gqa=self.kv_heads != self.heads)  # (1, H, m, d)
        return block["o"](out[0].transpose(0, 1).reshape(m, -1))

    def rollback(self, length: int) -> None:
        """Forget every cached token after the first `length` ones (their columns are overwritten later)."""
        self.length = min(self.length, check_integer("length", length, minimum=0))


def _block_weights(layer: torch.nn.Module) -> dict:
    """One decoder block by role: the norms' weight tensors, and the linear layers'
    `forward` methods (their own kernels and biases, without module-call overhead)."""
    attention, mlp = layer.self_attn, layer.mlp
    return {
        "norm1": layer.input_layernorm.weight, "norm2": layer.post_attention_layernorm.weight,
        "q": attention.q_proj.forward, "k": attention.k_proj.forward,
        "v": attention.v_proj.forward, "o": attention.o_proj.forward,
        "gate": mlp.gate_proj.forward, "up": mlp.up_proj.forward, "down": mlp.down_proj.forward,
    }


def lean_pass_seconds(model: PreTrainedModel, context: int, repeats: int = 20, warmup: int = 3) -> float:
    """Median time of one 1-token `LeanForward` pass after `context` cached tokens."""
    lean = LeanForward(model, max_length=context + 1)
    device = model_device(model)
    sequence = torch.randint(0, vocab_size(model), (1, context + 1), device=device)
    lean.last_logits(sequence[:, :context], 1)  # fill the cache

    def one_pass() -> None:
        lean.last_logits(sequence, 1)
        lean.rollback(context)

    return time_call(one_pass, repeats=repeats, warmup=warmup, device=device).median

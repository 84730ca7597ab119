"""A lean cached forward pass for a small Llama-style draft model (chapter 6's cost c).

The draft's job is to be cheap: speculative decoding pays when c = tau_q / tau_p is
small. A one-layer draft does little arithmetic, so its time per token is mostly
per-call overhead: a `transformers` forward builds attention masks, position
embeddings and cache objects, and walks a dozen Python modules, for a pass whose
matrix products take a fraction of a millisecond on a CPU. `LeanForward` runs the
same weights through the same arithmetic with none of that. It is
`static.StaticForward` run eagerly over the cached length (no CUDA graphs, no
whole-buffer mask), so the arithmetic is written once, in `blocks`:

* the keys and values live in one preallocated buffer per layer, (H_kv, P, d), so a
  pass writes its new columns in place and `rollback(n)` only lowers a length;
* the rotary cos / sin rows for every position are computed once, by the model's own
  rotary-embedding module (so any rope scaling whose rows do not depend on the
  sequence length is honoured);
* each block is RMSNorm, attention (`scaled_dot_product_attention`, grouped-query
  when H_kv < H, no mask for a one-token pass), RMSNorm, SwiGLU, read from the
  model's own modules; the linear layers are called through their own `forward`, so
  a draft prepacked by `packed.pack_linear_layers` runs its oneDNN kernels here too,
  which on a CPU in bfloat16 beat plain `F.linear` (`packed`'s docstring; the
  benchmark report `specdec_ref/data/bench-tiny-cpu.json` compares with and without).

It answers the `kv_cache.LogitsSource` question ("logits of the last m positions of
this sequence") and plugs into the decoder as a drafter:
`speculative_generate(target, ModelDrafter(LeanForward(draft), sampling, generator),
ids, ...)`; the tree decoder grows its trees in the same buffers (`tree_logits`,
`keep`: `tree_forward.TreeLogitsSource`).

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
from transformers import PreTrainedModel

from ..timing import time_call
from ..validation import model_device, vocab_size
from .blocks import static_unsupported
from .static import StaticForward, position_limit

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
    return static_unsupported(model)  # sliding windows, rope tables that follow the length


class LeanForward(StaticForward):
    """A Llama-style model's cached forward pass with no per-call framework overhead:
    `StaticForward` with no graphs, attending over the cached length."""

    def __init__(self, model: PreTrainedModel, max_length: int | None = None) -> None:
        """Args:
            model: a Llama-style causal LM (`LEAN_MODEL_TYPES`), in eval mode.
            max_length: the most tokens a sequence may reach (default: the model's
                max_position_embeddings).

        Raises:
            TypeError: if `model` is not a `transformers` model.
            ValueError: if the model is not supported, or `max_length` is not in
                [1, max_position_embeddings].
        """
        if isinstance(model, PreTrainedModel):
            reason = lean_unsupported(model)
            if reason is not None:
                raise ValueError(f"LeanForward cannot run {type(model).__name__}: {reason}; use CachedForward")
            max_length = position_limit(model) if max_length is None else max_length
        super().__init__(model, max_length, cuda_graphs=False, static_shapes=False)


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

"""One call to the fastest exact configuration of a pair: `prepare(draft_model, target_model)`.

The decoder's output does not depend on how fast a pass is, so the speed-ups of this
package (`packed`, `batch_invariant`, `lean`, `static`) can be switched on together,
for the device the models are on, without a reader having to assemble them:

* on a CPU: both models in bfloat16 where the CPU computes it natively (AVX512-BF16
  or AMX; elsewhere the dtype as loaded), their linear layers prepacked by oneDNN, the
  target's attention grouped and eager (`batch_invariant.GROUPED`: each row of a
  verification pass is bitwise a one-token step's, so greedy output is the target's
  own greedy output token for token), and a Llama-style draft run by `LeanForward`;
* on a GPU: both models behind `StaticForward`, a static KV cache whose decoding
  passes are replayed as CUDA graphs, in the dtype they were loaded in.

`prepare` changes the models in place (dtype, packed layers, attention) and returns a
`FastPair`: pass `pair.target` and `pair.draft` to `speculative_generate` as you
would pass the models; `pair.target_model.generate(...)` is the baseline in the same
configuration. `describe()` says what was chosen and why; the benchmark records it.

    fast = prepare(draft_model, target_model)
    print(fast.describe())
    out = speculative_generate(fast.target, fast.draft, input_ids, max_new_tokens=64,
                               num_draft_tokens=4, sampling=SamplingConfig(temperature=0))

The chapters keep the plain models: they teach the algorithm, not the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..kv_cache import LogitsSource
from ..validation import model_device
from .batch_invariant import GROUPED, use_rowwise_attention
from .blocks import static_unsupported
from .lean import LeanForward, lean_unsupported
from .packed import pack_linear_layers, packing_unsupported
from .static import StaticForward


@dataclass
class FastPair:
    """A prepared pair: what to pass to `speculative_generate`, and what was chosen."""

    target: PreTrainedModel | LogitsSource  # pass as target_model
    draft: PreTrainedModel | LogitsSource  # pass as draft_model
    target_model: PreTrainedModel  # the prepared target (for `generate`, the baseline)
    draft_model: PreTrainedModel  # the prepared draft
    choices: dict[str, str] = field(default_factory=dict)  # what was chosen -> why

    def describe(self) -> str:
        """What `prepare` chose, one line each (at most 80 characters)."""
        device = model_device(self.target_model)
        lines = [f"specdec_ref.fast.prepare on {device.type}:"]
        lines += [f"  {name + ':':<10} {why}" for name, why in self.choices.items()]
        return "\n".join(lines)


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has native bfloat16 arithmetic (AVX512-BF16 or AMX)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def prepare(draft_model: PreTrainedModel, target_model: PreTrainedModel, *,
            max_length: int | None = None, dtype: torch.dtype | None = None) -> FastPair:
    """Put a pair on the fastest path that keeps the decoder exact, in place.

    Args:
        draft_model, target_model: a pair on one device (as `models.load_pair` returns it).
        max_length: on a GPU, the longest sequence (prompt + new tokens) the static caches
            hold (None: the model's context length, at most `static.DEFAULT_MAX_LENGTH`).
        dtype: the dtype of both models (None: chosen for the device, see the module).

    Returns:
        A `FastPair`; its `describe()` says what was chosen.

    Raises:
        ValueError: if the models are on different devices, or `dtype` is not a
            floating-point torch.dtype.
    """
    device = model_device(target_model)
    if model_device(draft_model) != device:
        raise ValueError(f"draft_model is on {model_device(draft_model)} but target_model on {device}: "
                         "put both on one device before prepare")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")
    for model in (draft_model, target_model):
        model.eval()
    if device.type == "cuda":
        return _prepare_gpu(draft_model, target_model, max_length, dtype)
    return _prepare_cpu(draft_model, target_model, dtype)


def _prepare_cpu(draft_model: PreTrainedModel, target_model: PreTrainedModel,
                 dtype: torch.dtype | None) -> FastPair:
    choices = {}
    loaded = target_model.dtype
    if dtype is None:
        native = cpu_computes_bfloat16()
        dtype = torch.bfloat16 if native else loaded
        why = "the CPU computes it natively" if native else "no native bfloat16 on this CPU"
    else:
        why = "as asked"
    for model in (draft_model, target_model):
        model.to(dtype)
    choices["dtype"] = f"{str(dtype).removeprefix('torch.')} ({why}; loaded as {str(loaded).removeprefix('torch.')})"
    reasons = [packing_unsupported(model) for model in (draft_model, target_model)]
    if all(reason is None for reason in reasons):
        layers = [pack_linear_layers(model) for model in (draft_model, target_model)]
        choices["linear"] = f"prepacked by oneDNN ({layers[0]} draft, {layers[1]} target layers)"
    else:
        choices["linear"] = f"as loaded: {next(r for r in reasons if r)}"
    try:
        use_rowwise_attention(target_model, GROUPED)
        choices["attention"] = f"target {GROUPED}: each row of a pass is a step's, bit for bit"
    except ValueError as error:
        choices["attention"] = f"target as loaded ({error}); greedy exact up to near-ties"
    reason = lean_unsupported(draft_model)
    draft = draft_model if reason else LeanForward(draft_model)
    choices["draft"] = f"as loaded ({reason})" if reason else "LeanForward: the cached pass without framework work"
    choices["target"] = "the model, behind the decoder's CachedForward"
    return FastPair(target_model, draft, target_model, draft_model, choices)


def _prepare_gpu(draft_model: PreTrainedModel, target_model: PreTrainedModel, max_length: int | None,
                 dtype: torch.dtype | None) -> FastPair:
    choices = {}
    if dtype is not None:
        for model in (draft_model, target_model):
            model.to(dtype)
    choices["dtype"] = str(target_model.dtype).removeprefix("torch.") + (" (as asked)" if dtype else " (as loaded)")
    sources = {}
    for role, model in (("target", target_model), ("draft", draft_model)):
        reason = static_unsupported(model)
        sources[role] = model if reason else StaticForward(model, max_length, max_graph_tokens=16)
        choices[role] = (f"as loaded ({reason})" if reason else
                         f"StaticForward, CUDA graphs, up to {sources[role].max_length} tokens")
    return FastPair(sources["target"], sources["draft"], target_model, draft_model, choices)

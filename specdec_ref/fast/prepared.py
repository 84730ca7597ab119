"""One call to the fastest exact configuration of a pair: `prepare(draft_model, target_model)`.

The decoder's output does not depend on how fast a pass is, so the speed-ups of this
package (`packed`, `batch_invariant`, `lean`, `static`) can be switched on together,
for the device the models are on, without a reader having to assemble them:

* on a CPU: both models in bfloat16 where the CPU computes it natively (AVX512-BF16
  or AMX; elsewhere the dtype as loaded), their linear layers prepacked by oneDNN, the
  target's attention grouped and eager (`batch_invariant.GROUPED`: each row of a
  verification pass is bitwise a one-token step's, so greedy output is the target's
  own greedy output token for token), and a Llama-style draft run by `LeanForward`.
  A target whose attention GROUPED cannot take over (a sliding window, soft-capped
  logits) keeps its attention and its dtype: in bfloat16 its near-ties would flip;
* on a GPU: both models behind `StaticForward`, a static KV cache whose decoding
  passes are replayed as CUDA graphs, in the dtype they were loaded in.

`prepare` changes the models in place (dtype, packed layers, attention) and returns a
`FastPair`: pass `pair.target` and `pair.draft` to `speculative_generate` as you
would pass the models; `pair.target_model.generate(...)` is the baseline in the same
configuration. `describe()` says what was chosen and why; `plan` says it without
changing anything, and the benchmark records it.

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

from ..kv_cache import LogitsSource, uses_sliding_window
from ..validation import check_integer, model_device
from .batch_invariant import GROUPED, use_rowwise_attention
from .blocks import static_unsupported
from .lean import LeanForward, lean_unsupported
from .packed import pack_linear_layers, packing_unsupported
from .static import StaticForward, position_limit


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
        return describe(model_device(self.target_model), self.choices)


def describe(device: torch.device, choices: dict[str, str]) -> str:
    """`FastPair.describe`'s text for `choices` made on `device`."""
    lines = [f"specdec_ref.fast.prepare on {device.type}:"]
    lines += [f"  {name + ':':<10} {why}" for name, why in choices.items()]
    return "\n".join(lines)


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has native bfloat16 arithmetic (AVX512-BF16 or AMX)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


@dataclass(frozen=True)
class Plan:
    """What `prepare` does to a pair on its device, and why (`choices`, for `describe`)."""

    dtype: torch.dtype  # both models' dtype
    pack: bool  # prepack both models' linear layers (CPU)
    grouped: bool  # the target's attention becomes GROUPED (CPU)
    lean: bool  # the draft runs through LeanForward (CPU)
    static: tuple[str, ...]  # the roles ("target", "draft") put behind StaticForward (GPU)
    choices: dict[str, str]  # what was chosen -> why, in `describe`'s order


def grouped_unsupported(model: PreTrainedModel) -> str | None:
    """Why the GROUPED attention cannot make every row of `model`'s passes bitwise a
    one-token step's (None: it can). It falls back to sdpa under a sliding window and
    cannot soft-cap attention logits."""
    config = getattr(model.config, "text_config", model.config)
    if not hasattr(model, "set_attn_implementation"):
        return "this transformers cannot switch the attention"
    window = getattr(config, "sliding_window", None)  # Qwen2 sets one that it does not use
    if uses_sliding_window(config) or (window and getattr(config, "use_sliding_window", True)):
        return "a sliding window"
    if getattr(config, "attn_logit_softcapping", None):
        return "soft-capped attention logits"
    return None


def check_pair(draft_model: object, target_model: object) -> None:
    """Both models are `transformers` models on one device; else a TypeError / ValueError
    naming the argument (a `LeanForward` or `StaticForward` is what `prepare` makes, not
    what it takes)."""
    for name, model in (("draft_model", draft_model), ("target_model", target_model)):
        if not isinstance(model, PreTrainedModel):
            raise TypeError(f"{name} must be a transformers PreTrainedModel (prepare builds the "
                            f"LeanForward or StaticForward itself), got {type(model).__name__}")
    device = model_device(target_model)
    if model_device(draft_model) != device:
        raise ValueError(f"draft_model is on {model_device(draft_model)} but target_model on {device}: "
                         "put both on one device before prepare")


def plan(draft_model: PreTrainedModel, target_model: PreTrainedModel, *,
         dtype: torch.dtype | None = None) -> Plan:
    """What `prepare` would do to this pair on its device; changes nothing (the benchmark
    records its choices next to its arms). Every choice is made for the dtype the
    models will have, not the one they have now."""
    check_pair(draft_model, target_model)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")
    device, loaded = model_device(target_model), target_model.dtype
    if device.type == "cuda":
        choices = {"dtype": f"{_name(dtype)} (as asked)" if dtype else f"{_name(loaded)} (as loaded)"}
        static = []
        for role, model in (("target", target_model), ("draft", draft_model)):
            reason = static_unsupported(model)
            choices[role] = f"as loaded ({reason})" if reason else "StaticForward, with CUDA graphs"
            static += [] if reason else [role]
        return Plan(dtype or loaded, False, False, False, tuple(static), choices)
    not_grouped = grouped_unsupported(target_model)
    if dtype is not None:
        why = "as asked"
    elif not_grouped:  # bfloat16 near-ties would flip greedy tokens
        dtype, why = loaded, "bfloat16 needs grouped attention"
    elif cpu_computes_bfloat16():
        dtype, why = torch.bfloat16, "the CPU computes it natively"
    else:
        dtype, why = loaded, "no native bfloat16 on this CPU"
    choices = {"dtype": f"{_name(dtype)} ({why}; loaded as {_name(loaded)})"}
    # Packed in the dtype they are cast to: oneDNN packs float32 and bfloat16 only.
    unpackable = next((r for r in (packing_unsupported(m, dtype) for m in (draft_model, target_model)) if r),
                      None)
    choices["linear"] = f"as loaded ({unpackable})" if unpackable else "prepacked by oneDNN, in both models"
    choices["attention"] = (f"target as loaded ({not_grouped})" if not_grouped
                            else f"target {GROUPED}: each row of a pass is a step's, bit for bit")
    not_lean = lean_unsupported(draft_model)
    choices["draft"] = f"as loaded ({not_lean})" if not_lean else "LeanForward: the cached pass without framework work"
    choices["target"] = "the model, behind the decoder's CachedForward"
    return Plan(dtype, unpackable is None, not_grouped is None, not_lean is None, (), choices)


def prepare(draft_model: PreTrainedModel, target_model: PreTrainedModel, *,
            max_length: int | None = None, dtype: torch.dtype | None = None) -> FastPair:
    """Put a pair on the fastest path that keeps the decoder exact, in place (see `plan`).

    Args:
        draft_model, target_model: a pair on one device (as `models.load_pair` returns it).
        max_length: on a GPU, the longest sequence (prompt + new tokens) the static caches
            hold (None: the model's context length, at most `static.DEFAULT_MAX_LENGTH`).
        dtype: the dtype of both models (None: chosen for the device, see the module).

    Returns:
        A `FastPair`; its `describe()` says what was chosen.

    Raises:
        TypeError: if a model is not a `transformers` model.
        ValueError: if the models are on different devices, `dtype` is not a
            floating-point torch.dtype, or `max_length` is not None or an integer
            >= 1 (on a GPU, within the model's positions). Nothing is changed then:
            the whole plan is checked before the first model is touched.
    """
    # 1. Check everything, change nothing.
    chosen = plan(draft_model, target_model, dtype=dtype)
    models = {"target": target_model, "draft": draft_model}
    # On a GPU the static caches hold max_length tokens, within each model's positions.
    limit = min((position_limit(models[role]) for role in chosen.static), default=None)
    check_integer("max_length", max_length, minimum=1, maximum=limit, optional=True)
    choices = dict(chosen.choices)
    # 2. The attention first: transformers may still refuse it, before any weight changed.
    if chosen.grouped:
        use_rowwise_attention(target_model, GROUPED)
    # 3. Then the dtype and the packed layers, which the plan has checked for that dtype.
    for model in models.values():
        cast(model.eval(), chosen.dtype)
        if chosen.pack:
            pack_linear_layers(model)
    sources = {role: StaticForward(model, max_length, max_graph_tokens=16) if role in chosen.static else model
               for role, model in models.items()}
    if "target" in chosen.static:
        choices["target"] += f", up to {sources['target'].max_length} tokens"
    if chosen.lean:
        sources["draft"] = LeanForward(draft_model)
    return FastPair(sources["target"], sources["draft"], target_model, draft_model, choices)


def cast(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """`model.to(dtype)`, keeping the rotary tables' frequencies in float32, as
    `from_pretrained(..., dtype=dtype)` does: rounded to bfloat16 they move the
    angles enough to flip greedy near-ties (a model loaded in bfloat16 and one cast
    to it would then decode differently)."""
    kept = {name: buffer for name, buffer in model.named_buffers() if name.endswith("inv_freq")}
    model.to(dtype)
    for name, buffer in kept.items():
        owner, _, attribute = name.rpartition(".")
        model.get_submodule(owner)._buffers[attribute] = buffer
    return model


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

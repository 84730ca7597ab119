"""Prepacked linear layers: a CPU verification pass that costs about one decoding step.

Chapter 1's argument says a pass over K + 1 tokens should cost about what a pass over one
token costs, because both stream the same weights. On a CPU with `torch`'s default
kernels it does not quite: with one row of input, `torch.nn.functional.linear` runs a
matrix-vector product that reads the weight once, but with m > 1 rows it calls a
general matrix product (MKL's sgemm), which first copies the weight into a blocked
layout, on every call, for every layer. For the tiny target that copy is most of the
price of verification: in float32 a 6-token pass costs about 1.5 decoding steps
(`specdec_ref/data/bench-tiny-cpu-plain.json`).

oneDNN can make that copy once and keep it ("prepacking"; `torch.compile`'s CPU
freezing does the same). `pack_linear_layers(model)` swaps every `nn.Linear` of a CPU
model for a `PackedLinear` that holds the same weight Parameter (so `state_dict`, tied
weights and `save_pretrained` are unchanged) plus a prepacked copy, used whenever no
gradient is needed. A 6-token pass of the tiny target then costs about one step, and in
bfloat16 a one-token step is faster too (`specdec_ref/data/bench-tiny-cpu.json`).

The packed copy must follow the weight. A layer repacks before a pass when the
weight's version counter moved (any in-place write: `copy_` under `no_grad`,
`load_state_dict`, `nn.init`) or its storage changed (`weight.data = new`, `.to()`).
A write through `weight.data` bumps no counter: `.data` is a fresh alias with a
version of its own, so `lm_head.weight.data.copy_(new)` would leave a stale packed
copy and silently wrong logits. A packed layer therefore marks its weight as a
`WatchedParameter`, an `nn.Parameter` whose `.data` is an alias that shares the
weight's version counter (`detach()`), so those writes are seen too, even through a
`.data` view taken earlier; the check costs two integer comparisons per call.
Writes that bypass tensors altogether (`.numpy()` views, `untyped_storage()`) are
not seen: after one, call `repack(model)`. `unpack_linear_layers` gives the weights
their plain class back.

oneDNN compiles one kernel per shape it meets and keeps 1,024 of them; a speculative
loop meets more (rows x context length), so `import specdec_ref` raises that limit
(`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, see the package's `__init__`).

Invariant: a packed model computes the same function up to float rounding (logits
within 1e-5 of the unpacked model's in float32 on the tests' models; greedy output
identical), and each row of a packed layer's output is bitwise what that row alone
gives, so a pass over several tokens stays batch-invariant in bfloat16 when its
attention is too (`batch_invariant`; `tests/test_packed.py`, `tests/test_batch_invariant.py`). Only the speed of a
pass changes, so every decoder in this package, and `transformers`' own `generate`,
runs a packed model unchanged.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..validation import check_integer

# Dtypes that oneDNN prepacks for a linear layer on a CPU.
PACKED_DTYPES = (torch.float32, torch.bfloat16)
_NO_SCALARS: list = []  # the kernel's post-op arguments: none
_LINEAR = getattr(getattr(torch.ops.mkldnn, "_linear_pointwise", None), "default", None)


def packing_unsupported(model: nn.Module, dtype: torch.dtype | None = None) -> str | None:
    """Why `pack_linear_layers` cannot pack `model`, once cast to `dtype` (None: as it
    is), or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn) backend"
    if _LINEAR is None:
        return "this torch build has no oneDNN linear kernel (torch.ops.mkldnn._linear_pointwise)"
    parameter = next(model.parameters(), None)
    if parameter is None:
        return "the model has no parameters"
    if parameter.device.type != "cpu":
        return f"the model is on {parameter.device}, and prepacking is for CPU models"
    dtype = parameter.dtype if dtype is None else dtype
    if dtype not in PACKED_DTYPES:
        names = [str(kind).removeprefix("torch.") for kind in (*PACKED_DTYPES, dtype)]
        return f"oneDNN packs {' and '.join(names[:-1])}, not {names[-1]}"
    return _cpu_refuses(dtype)


@functools.cache
def _cpu_refuses(dtype: torch.dtype) -> str | None:
    """Why this CPU's oneDNN cannot prepack `dtype`, or None: bfloat16 needs AVX-512 (BW, VL,
    DQ) or AVX-NE-CONVERT, which an AVX2-only CPU lacks. Asked of oneDNN itself, once."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), 1)
    except RuntimeError as error:
        name = str(dtype).removeprefix("torch.")
        return f"this CPU's oneDNN cannot prepack {name}: {str(error).splitlines()[0]}"
    return None


class WatchedParameter(nn.Parameter):
    """An `nn.Parameter` whose `.data` shares its version counter, so writes through
    `.data` bump `_version` and a `PackedLinear` sees them. Everything else is
    `nn.Parameter`'s: the same object keeps its identity, storage and ties."""

    @property
    def data(self) -> torch.Tensor:
        """The weight without autograd history: `detach()`, which shares the version counter."""
        return torch.Tensor.detach(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        torch._C.TensorBase.data.__set__(self, value)

    def __repr__(self) -> str:
        return repr(nn.Parameter(torch.Tensor.detach(self), self.requires_grad))


def _watch(weight: nn.Parameter, watched: bool) -> None:
    """Make a plain Parameter a `WatchedParameter` (or back), in place: ties stay tied."""
    kind = type(weight)
    if watched and kind is nn.Parameter:
        weight.__class__ = WatchedParameter
    elif not watched and kind is WatchedParameter:
        weight.__class__ = nn.Parameter


class PackedLinear(nn.Module):
    """`nn.Linear` with a oneDNN-prepacked copy of its weight for inference."""

    def __init__(self, linear: nn.Linear, rows: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.rows = rows
        self.weight = linear.weight  # the same Parameter: state_dict and tying unchanged
        self.bias = linear.bias
        self.enabled = True  # False: plain F.linear (`set_packing`), to time both ways on one model
        self._packed: torch.Tensor | None = None  # None: not packed (yet, or not packable)
        self._version, self._pointer = -1, -1  # the weight's identity when it was packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        # The packed copy serves inference on the CPU in the weight's dtype;
        # anything else (switched off, training, another device, mixed
        # dtypes) takes plain F.linear.
        training = torch.is_grad_enabled() and (weight.requires_grad
                                                or x.requires_grad)
        if (self.enabled and x.is_cpu and x.dtype is weight.dtype
                and not training):
            # Repack when the weight changed in place (its version) or
            # was replaced (its data pointer).
            if (weight._version != self._version
                    or weight.data_ptr() != self._pointer):
                self._repack()
            if self._packed is not None:
                return _LINEAR(x, self._packed, self.bias, "none",
                               _NO_SCALARS, "")
        return F.linear(x, weight, self.bias)

    def _repack(self) -> None:
        _watch(self.weight, True)  # so that writes through .data move its version
        weight = self.weight.detach()
        packable = weight.is_cpu and weight.dtype in PACKED_DTYPES
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, self.rows) if packable else None
        self._version, self._pointer = self.weight._version, weight.data_ptr()

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed copy behind (oneDNN's opaque tensor cannot be
        copied); the new layer packs its own on its first call."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_packed": None, "_version": -1, "_pointer": -1}

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, rows={self.rows}")


def pack_linear_layers(model: nn.Module, rows: int = 8) -> int:
    """Swap every `nn.Linear` of `model` for a `PackedLinear`, in place.

    Args:
        model: a model on the CPU in float32 or bfloat16 (`packing_unsupported`).
        rows: the number of input rows oneDNN tunes the packed layout for (K + 1
            for a verification pass; any row count still works).

    Returns:
        The number of layers packed (0 when `model` was packed already).

    Raises:
        ValueError: if `rows` is not an integer >= 1 or the model cannot be packed.
    """
    check_integer("rows", rows, minimum=1)
    reason = packing_unsupported(model)
    if reason is not None:
        raise ValueError(f"cannot pack {type(model).__name__}: {reason}")
    return _swap(model, nn.Linear, lambda layer: PackedLinear(layer, rows))


def unpack_linear_layers(model: nn.Module) -> int:
    """Undo `pack_linear_layers`: plain `nn.Linear` layers on the same weights; returns how many.

    Kept for users who want the plain model back (and for the tests, which check that a
    packed model round-trips); nothing in the package calls it (`set_packing` switches
    packed layers off in place instead)."""

    def plain(layer: PackedLinear) -> nn.Linear:
        linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                           device="meta")
        linear.weight, linear.bias = layer.weight, layer.bias
        _watch(layer.weight, False)
        return linear

    return _swap(model, PackedLinear, plain)


def set_packing(model: nn.Module, enabled: bool) -> int:
    """Switch every `PackedLinear` of `model` to its prepacked copy (True) or to plain
    `F.linear` on the same weight (False); returns how many layers were switched."""
    layers = [module for module in model.modules() if isinstance(module, PackedLinear)]
    for layer in layers:
        layer.enabled = bool(enabled)
    return len(layers)


def repack(model: nn.Module) -> int:
    """Repack every `PackedLinear` of `model` before its next pass (after a write that no
    version counter records: `.numpy()` views, `untyped_storage()`); returns how many."""
    layers = [module for module in model.modules() if isinstance(module, PackedLinear)]
    for layer in layers:
        layer._version = -1
    return len(layers)


def is_packed(model: nn.Module) -> bool:
    """Whether any layer of `model` is a `PackedLinear` (the tests' check that a run packed
    what it said it would; the package itself never needs to ask)."""
    return any(isinstance(module, PackedLinear) for module in model.modules())


def _swap(model: nn.Module, kind: type, make) -> int:
    """Replace every submodule of type `kind` (exactly) by make(submodule); returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is kind:
                setattr(parent, name, make(child))
                swapped += 1
    return swapped

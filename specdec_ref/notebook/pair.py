"""Every chapter's first step: pick the model pair, load it, say what was picked.

On Google Colab with a GPU a chapter loads the article's pair (gpt2 -> gpt2-xl);
everywhere else, and in the tests, the tiny pair embedded in the package, which needs
no network. A name passed to `open_pair`, or the environment variable `SPECDEC_PAIR`,
overrides the choice.

Invariant: `choose_pair` is a pure function of its inputs (override, environment,
Colab, CUDA), so a notebook's pair is known before anything is loaded.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The environment variables that override the pair, its dtype and the CPU threads in every chapter.
PAIR_ENV = "SPECDEC_PAIR"
DTYPE_ENV = "SPECDEC_DTYPE"
THREADS_ENV = "SPECDEC_THREADS"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# How far two computations of the same probabilities may differ in each dtype (one pass
# against K + 1 passes, cached against uncached), at least: float32 rounding, or half
# precision's 8 (bfloat16) and 11 (float16) significant bits. Measured on the tiny pair in
# bfloat16: up to 7.8e-3 between the one-pass and the incremental p over 20 drafts. A pair
# whose logits are larger needs more: see `probability_tolerance`.
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 1e-2}
# The text whose logits give a pair's logit scale (any short text will do).
SCALE_TEXT = "The capital of France is"
# The pair a Colab GPU gets (the article's), and the one everything else gets.
GPU_PAIR = "gpt2"
CPU_PAIR = "tiny"
# Chapter 9's counterpart of each pair: the same target, a draft with a tokenizer of its own.
CROSS_PAIRS = {"tiny": "tiny-cross", "gpt2": "pythia-gpt2"}


def probability_tolerance(dtype: torch.dtype, logit_scale: float) -> float:
    """How far two computations of the same probabilities may differ, from the dtype and the logits' scale.

    Probabilities are computed in float32 (`sampling.logits_to_probs`), but the logits come
    out of the model rounded to its dtype: near a logit of size s, one unit in the last
    place (ulp) is 2 ** floor(log2 s) * eps, so two computations of the same logit can
    differ by one ulp. A softmax moves p_i by p_i * (dz_i - sum_j p_j dz_j), at most half
    the largest logit change: the bound is ulp(s) / 2, and never less than `TOLERANCES`.
    The tiny pair's top logits are about 9 in size (bfloat16: 3.1e-2); logits of 64 to 128
    get 0.25 in bfloat16 and 3.1e-2 in float16. On GPT-2 XL in bfloat16 the one-pass and
    K + 1-pass probabilities were measured 0.060 apart, twice the tiny pair's 3e-2.

    Args:
        dtype: the dtype the model computes in.
        logit_scale: the size of the largest logits that matter (`BookPair.logit_scale`).
    """
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype must be one of {', '.join(map(str, TOLERANCES))}, got {dtype!r}")
    if not logit_scale >= 0:  # also refuses nan
        raise ValueError(f"logit_scale must be a non-negative number, got {logit_scale!r}")
    ulp = 2.0 ** math.floor(math.log2(max(logit_scale, 1.0))) * torch.finfo(dtype).eps
    return max(TOLERANCES[dtype], ulp / 2)


def cpu_threads(environ: Mapping[str, str] | None = None) -> int:
    """The torch CPU threads a chapter uses: `$SPECDEC_THREADS`, else 1 (steady timings on a busy machine).

    `make nbval` sets 2: another thread count changes the order of float reductions the way
    another CPU does, so an output that depends on the last bits fails here first.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(THREADS_ENV, "1").strip()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer, got {value!r}")
    return int(value)


def chosen_dtype(environ: Mapping[str, str] | None = None) -> torch.dtype | None:
    """The dtype `$SPECDEC_DTYPE` names (float32, bfloat16, float16), else None: `load_pair` decides."""
    environ = os.environ if environ is None else environ
    value = environ.get(DTYPE_ENV, "").strip()
    if not value:
        return None
    if value not in DTYPES:
        raise ValueError(f"{DTYPE_ENV} must be one of {', '.join(DTYPES)}, got {value!r}")
    return DTYPES[value]


def on_colab() -> bool:
    """Whether this Python runs inside Google Colab."""
    return "google.colab" in sys.modules


def pair_choice(override: str | None = None, *, colab: bool | None = None, cuda: bool | None = None,
                environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The name of the pair a notebook should load, and why, in a phrase a reader can act on.

    Args:
        override: a pair name chosen in the notebook; wins over everything else.
        colab: running on Colab (default: detected).
        cuda: a CUDA GPU is available (default: detected).
        environ: the environment to read `SPECDEC_PAIR` from (default: `os.environ`).

    Returns:
        (name, reason): `override`, else `$SPECDEC_PAIR`, else "gpt2" on Colab with a
        GPU, else "tiny"; the reason says which of these decided.

    Raises:
        ValueError: if `override` or the variable is set but empty or not a string.
    """
    if override is not None:
        if not isinstance(override, str) or not override.strip():
            raise ValueError(f"override must be a pair name such as 'tiny' or 'gpt2', got {override!r}")
        return override.strip(), f"PAIR = {override.strip()!r} in the set-up cell"
    environ = os.environ if environ is None else environ
    if PAIR_ENV in environ:
        value = environ[PAIR_ENV].strip()
        if not value:
            raise ValueError(f"the environment variable {PAIR_ENV} is set but empty; unset it or name a pair")
        return value, f"{PAIR_ENV}={value} in the environment"
    colab = on_colab() if colab is None else colab
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if colab and cuda:
        return GPU_PAIR, "a GPU was found on Colab: the article's pair"
    if colab:
        return CPU_PAIR, "no GPU in this runtime (Runtime > Change runtime type > GPU)"
    if cuda:
        return CPU_PAIR, f"a GPU, but not Colab: set PAIR = {GPU_PAIR!r} for the article's"
    return CPU_PAIR, "no GPU found: the tiny pair shipped with the package"


def choose_pair(override: str | None = None, *, colab: bool | None = None, cuda: bool | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """The name of the pair a notebook should load (`pair_choice` without the reason)."""
    return pair_choice(override, colab=colab, cuda=cuda, environ=environ)[0]


@dataclass
class BookPair:
    """The models a chapter works with."""

    name: str  # the registry name passed to `load_pair`
    draft_model: PreTrainedModel  # the small, fast model that proposes tokens
    target_model: PreTrainedModel  # the large model whose distribution the output must follow
    tokenizer: PreTrainedTokenizerBase  # shared by both models
    device: torch.device  # where both models live
    reason: str = ""  # why this pair was chosen (`pair_choice`)
    draft_tokenizer: PreTrainedTokenizerBase | None = None  # the draft's own, in a cross pair (chapter 9)
    _logit_scale: float | None = field(default=None, repr=False)  # measured once, by `logit_scale`

    @property
    def dtype(self) -> torch.dtype:
        """The dtype both models compute in."""
        return next(self.target_model.parameters()).dtype

    @property
    @torch.no_grad()
    def logit_scale(self) -> float:
        """The size of the target's top logits: the largest |max logit| over the positions of `SCALE_TEXT`."""
        if self._logit_scale is None:
            logits = self.target_model(self.encode(SCALE_TEXT)).logits[0]  # (n, V)
            self._logit_scale = logits.float().amax(-1).abs().max().item()
        return self._logit_scale

    @property
    def tolerance(self) -> float:
        """How far two computations of the same probabilities may differ, in this dtype at these logits' scale."""
        return probability_tolerance(self.dtype, self.logit_scale)

    @torch.no_grad()
    def parting(self, ours: Sequence[int], theirs: Sequence[int],
                model: PreTrainedModel | None = None) -> tuple[int, float] | None:
        """Where two greedy token lists first differ, and how near a tie it was.

        Returns None when they agree; else (i, gap): the first index where they differ
        and |p(ours[i]) - p(theirs[i])| under the target's distribution after ours[:i]
        (`model`'s, when given: a copy of the target in another dtype). Half precision,
        or a GPU's kernels, can flip a near-tie (gap below `tolerance`); anything wider
        is a bug.
        """
        i = next((j for j, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        if i is None:
            return None if len(ours) == len(theirs) else (min(len(ours), len(theirs)), float("inf"))
        ids = torch.tensor([list(ours[:i])], device=self.device)  # (1, i)
        model = self.target_model if model is None else model
        p = model(ids).logits[0, -1].float().softmax(-1)  # the target's p at token i
        return i, abs(p[ours[i]] - p[theirs[i]]).item()

    def describe(self) -> str:
        """Short lines: the pair and its sizes, the vocabulary, the device and dtype, why this pair."""
        def millions(model: PreTrainedModel) -> str:
            return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M"

        where = self.device.type
        if self.device.type == "cuda":
            where = f"cuda ({torch.cuda.get_device_name(self.device)})"
        why = f"\nwhy: {self.reason}" if self.reason else ""
        return (f"pair {self.name!r}: draft {millions(self.draft_model)}, "
                f"target {millions(self.target_model)} parameters\n"
                + (f"vocabularies: target {len(self.tokenizer)}, draft {len(self.draft_tokenizer)} tokens\n"
                   if self.draft_tokenizer is not None else f"shared vocabulary: {len(self.tokenizer)} tokens\n") +
                f"device: {where}; dtype: {str(self.dtype).removeprefix('torch.')}{why}")

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of `text`, shape (1, n), on the pair's device."""
        return self.tokenizer(text, return_tensors="pt").input_ids.to(self.device)  # (1, n)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """The text of a sequence of token ids."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(ids)


def open_pair(override: str | None = None, *, device: torch.device | str | None = None,
              dtype: torch.dtype | None = None, cross: bool = False) -> BookPair:
    """Load the pair `choose_pair(override)` names, in eval mode, on `device`.

    Args:
        override: a pair name; None lets `choose_pair` decide.
        cross: chapter 9: load the named pair's counterpart whose draft has a tokenizer of
            its own (`CROSS_PAIRS`: "tiny" -> "tiny-cross", "gpt2" -> "pythia-gpt2");
            a name that is already such a pair is kept.
        device: default CUDA when available, else the CPU.
        dtype: default `$SPECDEC_DTYPE`, else `load_pair`'s choice (float32 on a CPU and for
            the tiny pair; bfloat16 on a GPU that computes it natively, else float16).

    Returns:
        A `BookPair`; print `.describe()` to show what was loaded.
    """
    from transformers.utils import logging as hf_logging

    from ..models import PAIRS, load_pair

    name, reason = pair_choice(override)
    if cross:
        name = CROSS_PAIRS.get(name, name)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    # An embedded pair loads in a blink: its progress bars (widgets in a notebook) would
    # only clutter the page. Downloads of hub pairs keep theirs.
    quiet = name in PAIRS and PAIRS[name].embedded and hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        loaded = load_pair(name, device=device, dtype=dtype or chosen_dtype())
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    if cross and not PAIRS[name].cross:
        raise ValueError(f"chapter 9 needs a pair whose draft has its own tokenizer (e.g. "
                         f"{sorted(set(CROSS_PAIRS.values()))}); {name!r} shares one tokenizer")
    return BookPair(name, loaded.draft_model.eval(), loaded.target_model.eval(), loaded.tokenizer, device, reason,
                    draft_tokenizer=getattr(loaded, "draft_tokenizer", None))



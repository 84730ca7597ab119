"""Every chapter's first step: pick the model pair, load it, say what was picked.

On Google Colab with a GPU a chapter loads the article's pair (gpt2 -> gpt2-xl);
everywhere else, and in the tests, the tiny pair embedded in the package, which needs
no network. A name passed to `open_pair`, or the environment variable `SPECDEC_PAIR`,
overrides the choice.

Invariant: `choose_pair` is a pure function of its inputs (override, environment,
Colab, CUDA), so a notebook's pair is known before anything is loaded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The environment variable that overrides the pair in every chapter.
PAIR_ENV = "SPECDEC_PAIR"
# The pair a Colab GPU gets (the article's), and the one everything else gets.
GPU_PAIR = "gpt2"
CPU_PAIR = "tiny"


def on_colab() -> bool:
    """Whether this Python runs inside Google Colab."""
    return "google.colab" in sys.modules


def choose_pair(override: str | None = None, *, colab: bool | None = None, cuda: bool | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """The name of the pair a notebook should load.

    Args:
        override: a pair name chosen in the notebook; wins over everything else.
        colab: running on Colab (default: detected).
        cuda: a CUDA GPU is available (default: detected).
        environ: the environment to read `SPECDEC_PAIR` from (default: `os.environ`).

    Returns:
        `override`, else `$SPECDEC_PAIR`, else "gpt2" on Colab with a GPU, else "tiny".

    Raises:
        ValueError: if `override` or the variable is set but empty or not a string.
    """
    if override is not None:
        if not isinstance(override, str) or not override.strip():
            raise ValueError(f"override must be a pair name such as 'tiny' or 'gpt2', got {override!r}")
        return override.strip()
    environ = os.environ if environ is None else environ
    if PAIR_ENV in environ:
        value = environ[PAIR_ENV].strip()
        if not value:
            raise ValueError(f"the environment variable {PAIR_ENV} is set but empty; unset it or name a pair")
        return value
    colab = on_colab() if colab is None else colab
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return GPU_PAIR if colab and cuda else CPU_PAIR


@dataclass
class BookPair:
    """The models a chapter works with."""

    name: str  # the registry name passed to `load_pair`
    draft_model: PreTrainedModel  # the small, fast model that proposes tokens
    target_model: PreTrainedModel  # the large model whose distribution the output must follow
    tokenizer: PreTrainedTokenizerBase  # shared by both models
    device: torch.device  # where both models live

    def describe(self) -> str:
        """One line: the pair, the size of each model, the device and dtype."""
        def millions(model: PreTrainedModel) -> str:
            return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters"

        dtype = next(self.target_model.parameters()).dtype
        return (f"pair {self.name!r}: draft {millions(self.draft_model)}, target {millions(self.target_model)}, "
                f"vocabulary {len(self.tokenizer)}, on {self.device.type} ({str(dtype).removeprefix('torch.')})")

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of `text`, shape (1, n), on the pair's device."""
        return self.tokenizer(text, return_tensors="pt").input_ids.to(self.device)  # (1, n)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """The text of a sequence of token ids."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(ids)


def open_pair(override: str | None = None, *, device: torch.device | str | None = None) -> BookPair:
    """Load the pair `choose_pair(override)` names, in eval mode, on `device`.

    Args:
        override: a pair name; None lets `choose_pair` decide.
        device: default CUDA when available, else the CPU.

    Returns:
        A `BookPair`; print `.describe()` to show what was loaded.
    """
    from transformers.utils import logging as hf_logging

    from ..models import PAIRS, load_pair

    name = choose_pair(override)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    # An embedded pair loads in a blink: its progress bars (widgets in a notebook) would
    # only clutter the page. Downloads of hub pairs keep theirs.
    quiet = name in PAIRS and PAIRS[name].embedded and hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        draft_model, target_model, tokenizer = load_pair(name, device=device)
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    return BookPair(name, draft_model.eval(), target_model.eval(), tokenizer, device)



"""Helpers for the book's notebooks: pick the model pair, and draw the recurring figures.

Every chapter opens with the same choice. On Google Colab with a GPU it loads the
article's pair (gpt2 -> gpt2-xl); everywhere else, and in the tests, the tiny pair
embedded in the package, which needs no network. A name passed to `open_pair`, or
the environment variable `SPECDEC_PAIR`, overrides the choice.

Invariant: `choose_pair` is a pure function of its inputs (override, environment,
Colab, CUDA), so a notebook's pair is known before anything is loaded. Nothing in
`specdec_ref` imports this module; matplotlib and ipywidgets are imported only by
the functions that draw, so the package itself needs neither.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .timing import Timing

# The environment variable that overrides the pair in every chapter.
PAIR_ENV = "SPECDEC_PAIR"
# The pair a Colab GPU gets (the article's), and the one everything else gets.
GPU_PAIR = "gpt2"
CPU_PAIR = "tiny"
# Figure size (inches) and resolution of every figure in the book: modest PNGs.
FIGSIZE = (6.4, 3.4)
DPI = 100


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
    from .models import load_pair

    name = choose_pair(override)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    draft_model, target_model, tokenizer = load_pair(name, device=device)
    return BookPair(name, draft_model.eval(), target_model.eval(), tokenizer, device)


def figure(ncols: int = 1, *, width: float | None = None, height: float | None = None):
    """A matplotlib figure of the book's size with `ncols` axes side by side: (fig, axes)."""
    import matplotlib.pyplot as plt

    w, h = FIGSIZE
    fig, axes = plt.subplots(1, ncols, figsize=(width or w, height or h), dpi=DPI, layout="constrained")
    return fig, axes


def plot_timings(ax, xs: Sequence[float], timings: Sequence[Timing], *, label: str, scale: float = 1e3,
                 marker: str = "o") -> None:
    """Median line with a shaded interquartile band, one point per x (times in ms by default)."""
    medians = [t.median * scale for t in timings]
    ax.plot(xs, medians, marker=marker, markersize=4, label=label)
    ax.fill_between(xs, [t.q1 * scale for t in timings], [t.q3 * scale for t in timings], alpha=0.25)


def plot_distributions(ax, p: torch.Tensor, q: torch.Tensor, *, labels: Sequence[str] | None = None,
                       top: int = 12, names: tuple[str, str] = ("target p", "draft q")) -> list[int]:
    """Side-by-side bars of the `top` most likely tokens under p or q; returns their ids.

    Args:
        ax: a matplotlib axes.
        p, q: two distributions over the same vocabulary, shape (V,).
        labels: the text of every token id (default: the ids themselves).
        top: how many tokens to show, ordered by max(p, q).
        names: the legend entries for p and q.
    """
    if p.shape != q.shape or p.dim() != 1:
        raise ValueError(f"p and q must be vectors of one shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    ids = torch.maximum(p, q).topk(min(top, p.numel())).indices.tolist()
    xs = torch.arange(len(ids), dtype=torch.float32)
    ax.bar(xs - 0.2, p[ids].float().cpu(), width=0.4, label=names[0])
    ax.bar(xs + 0.2, q[ids].float().cpu(), width=0.4, label=names[1])
    ax.set_xticks(xs.tolist(), [repr(labels[i]) if labels else str(i) for i in ids], rotation=60, fontsize=8)
    ax.set_ylabel("probability")
    ax.legend()
    return ids


def token_labels(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> dict[int, str]:
    """Readable text of each token id (for axis labels)."""
    return {i: tokenizer.decode([i]) for i in ids}


def slider_explorer(draw, sliders: Mapping[str, object], *, description: str = ""):
    """An ipywidgets explorer: `draw(**values)` re-runs whenever a slider moves.

    Args:
        draw: a function of the slider values that makes a matplotlib figure.
        sliders: keyword name -> ipywidgets slider.
        description: a line of text shown above the sliders.

    Returns:
        The widget box (display it, or leave it as the cell's last expression). The
        figure of the initial values is drawn once, so a static page shows it too.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    output = widgets.Output()

    def redraw(**values) -> None:
        with output:
            output.clear_output(wait=True)
            draw(**values)
            plt.show()

    controls = widgets.interactive(redraw, **sliders)
    header = [widgets.HTML(f"<p>{description}</p>")] if description else []
    box = widgets.VBox([*header, *controls.children[:-1], output])
    controls.update()
    return box

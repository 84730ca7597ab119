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

import math
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
    from transformers.utils import logging as hf_logging

    from .models import PAIRS, load_pair

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


def show_source(obj) -> object:
    """The source code of a module, class or function, syntax-highlighted in a notebook."""
    import inspect

    from IPython.display import Code

    return Code(inspect.getsource(obj), language="python")


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


def plot_pass_time(ax, config, *, dtype: str, bandwidth: float, peak_flops: float, context: int = 512,
                   max_tokens: int = 512, label: str = "") -> None:
    """Roofline time of one cached pass against the number of tokens in it (log-log).

    Uses `memory.step_flops`, `memory.step_bytes` and `memory.roofline_time`: the pass
    takes the longer of moving its bytes and doing its FLOPs.

    Args:
        ax: a matplotlib axes.
        config: the model's `transformers` configuration.
        dtype: the weights' number format, e.g. "bf16".
        bandwidth: bytes per second; peak_flops: FLOPs per second of the device.
        context: tokens already in the KV cache.
        max_tokens: the largest pass drawn.
        label: the legend entry (default: none).
    """
    from . import memory

    tokens = sorted({round(2 ** (i / 4)) for i in range(int(4 * math.log2(max_tokens)) + 1)})
    times = [memory.roofline_time(memory.step_flops(config, context=context, num_tokens=t),
                                  memory.step_bytes(config, context=context, dtype=dtype, num_tokens=t).total,
                                  peak_flops=peak_flops, bandwidth=bandwidth) for t in tokens]
    ax.loglog(tokens, [t * 1e3 for t in times], label=label or None)
    ax.set_xlabel("tokens per pass")
    ax.set_ylabel("time per pass (ms)")


def plot_roofline(ax, *, peak_flops: float, bandwidth: float, points: Mapping[str, float] | None = None,
                  label: str = "") -> None:
    """The roofline of a device: attainable FLOP/s against arithmetic intensity (log-log).

    Args:
        ax: a matplotlib axes.
        peak_flops: FLOPs per second; bandwidth: bytes per second.
        points: name -> arithmetic intensity of a computation, marked on the roof.
        label: the legend entry of the roof.
    """
    ridge = peak_flops / bandwidth
    intensity = [ridge / 1000 * 10 ** (i / 10) for i in range(61)]  # three decades either side of the ridge
    attainable = [min(peak_flops, x * bandwidth) for x in intensity]
    ax.loglog(intensity, attainable, label=label or None)
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    for name, x in (points or {}).items():
        ax.plot([x], [min(peak_flops, x * bandwidth)], "o")
        ax.annotate(name, (x, min(peak_flops, x * bandwidth)), textcoords="offset points", xytext=(5, -12),
                    fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("attainable FLOP/s")


def plot_verification_layout(ax, prefix: Sequence[str], drafts: Sequence[str]) -> None:
    """Draw which position's logits score which token in a verification pass.

    Args:
        ax: a matplotlib axes.
        prefix: the text of the last few prefix tokens (the last one is position n - 1).
        drafts: the text of the K drafted tokens (positions n .. n + K - 1).
    """
    tokens = [*prefix, *drafts, "bonus"]
    first = len(prefix) - 1  # the box of position n - 1, whose logits give p_0
    for j, text in enumerate(tokens):
        kind = "prefix" if j < len(prefix) else ("draft" if j < len(tokens) - 1 else "bonus")
        style = {"prefix": dict(fc="#dddddd", ls="-"), "draft": dict(fc="#fdd9b5", ls="-"),
                 "bonus": dict(fc="white", ls="--")}[kind]
        ax.text(j, 0, repr(text) if kind != "bonus" else "?", ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.35", ec="#555555", **style))
        if j >= first and j < len(tokens) - 1:
            # The logits at position j are the distribution of the token at j + 1.
            slot = j - first
            ax.annotate("", xy=(j + 1, 0.25), xytext=(j, 0.25),
                        arrowprops=dict(arrowstyle="->", color="#1f77b4", connectionstyle="arc3,rad=-0.5"))
            ax.text(j + 0.5, 0.85, f"$p_{{{slot}}}$", ha="center", fontsize=11, color="#1f77b4")
    ax.text(first - 0.5, -0.7, "prompt ...", ha="center", fontsize=9, color="#555555")
    ax.text(first + 1 + (len(drafts) - 1) / 2, -0.7, f"{len(drafts)} drafted tokens", ha="center", fontsize=9,
            color="#b35900")
    ax.set_xlim(-0.7, len(tokens) - 0.3)
    ax.set_ylim(-1.0, 1.3)
    ax.axis("off")


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

    def redraw(**values) -> None:
        draw(**values)
        plt.show()

    # interactive_output calls redraw once now, capturing the figure in the Output widget.
    output = widgets.interactive_output(redraw, dict(sliders))
    header = [widgets.HTML(f"<p>{description}</p>")] if description else []
    return widgets.VBox([*header, *sliders.values(), output])

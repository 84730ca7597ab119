"""The book's recurring figures and widgets, and `show_source` for the module code a chapter reads.

matplotlib and ipywidgets are imported only by the functions that draw, so the package
itself needs neither.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from ..timing import Timing

# Figure size (inches) and resolution of every figure in the book: modest PNGs.
FIGSIZE = (6.4, 3.4)
DPI = 100


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
    from .. import memory

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

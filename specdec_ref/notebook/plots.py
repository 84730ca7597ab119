"""The book's recurring figures and widgets, and `show_source` for the module code a chapter reads.

matplotlib and ipywidgets are imported only by the functions that draw, so the package
itself needs neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from ..timing import Timing

# Figure size (inches) and resolution of every figure in the book. DPI sets the size on
# the page (CSS pixels per inch); in a notebook, `crisp_inline_figures` stores PNGs of
# PIXEL_RATIO x DPI pixels per inch shown at that size, sharp on a high-density screen.
FIGSIZE = (6.4, 3.4)
DPI = 100
PIXEL_RATIO = 2


def _png_for_dense_screens(fig) -> tuple[str, dict[str, int]] | None:
    """A figure as base64 PNG at PIXEL_RATIO x its dpi, and its width in CSS pixels.

    The metadata holds the width only (myst-nb and Jupyter write it on the <img>), so a
    page narrower than the figure scales it down keeping its aspect ratio.
    """
    from base64 import b64encode
    from io import BytesIO

    if not fig.axes and not fig.lines:
        return None  # an empty figure shows nothing, as with matplotlib's own formatter
    buffer = BytesIO()
    fig.canvas.print_figure(buffer, format="png", dpi=PIXEL_RATIO * fig.dpi, bbox_inches="tight",
                            facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor())
    png = buffer.getvalue()
    width = int.from_bytes(png[16:20], "big")  # the IHDR chunk: width, then height, in pixels
    return b64encode(png).decode("ascii"), {"width": width // PIXEL_RATIO}


def crisp_inline_figures() -> bool:
    """Show a notebook's matplotlib figures sharp on high-density screens, at their size.

    Inline figures become PNGs of PIXEL_RATIO x DPI pixels per inch whose output metadata
    gives the width on the page (the figure's width at DPI). Activates the inline backend
    now, so that its own set-up (which registers the plain formatters) does not come later.
    Does nothing outside an IPython kernel or without matplotlib.

    Returns:
        Whether the figures' formatter was installed.
    """
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return False
    # Should the backend be set up again later (%matplotlib inline), it keeps 2x PNGs.
    shell.config.InlineBackend.figure_formats = {"retina"}
    try:
        import matplotlib_inline.backend_inline  # noqa: F401  (its import sets up the backend)
    except ImportError:
        pass
    shell.display_formatter.formatters["image/png"].for_type(Figure, _png_for_dense_screens)
    return True


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


def _visible(text: str, width: int = 10) -> str:
    """A token's text as a short label with visible whitespace, at most `width` characters.

    A space is drawn as "·", a newline as "↵", a tab as "⇥", a run of three or more spaces
    as "·×n"; longer text is cut with "…", and empty text is "∅".
    """
    label, i = "", 0
    while i < len(text):
        if text[i] == " ":
            run = len(text) - i - len(text[i:].lstrip(" "))
            label += "·" * run if run < 3 else f"·×{run}"
            i += run
        else:
            label += {"\n": "↵", "\t": "⇥"}.get(text[i], text[i])
            i += 1
    label = label or "∅"
    return label if len(label) <= width else label[: width - 1] + "…"


def plot_distributions(ax, dists: Mapping[str, torch.Tensor], *, decode: Callable[[list[int]], str] | None = None,
                       ids: Sequence[int] | None = None, top: int = 8, log: bool = False,
                       highlight: int | None = None) -> list[int]:
    """Horizontal bars: the probability that each distribution gives a few tokens, most likely on top.

    Args:
        ax: a matplotlib axes.
        dists: name -> a distribution over one vocabulary, shape (V,): one bar per name and token.
        decode: token ids -> text (e.g. `BookPair.decode`); the labels show the text with visible
            whitespace (· space, ↵ newline, ⇥ tab). Default: the ids themselves.
        ids: the tokens to show, top to bottom (default: the `top` most likely under any of `dists`).
        top: how many tokens to show when `ids` is None.
        log: a logarithmic probability axis, where small probabilities stay visible; a token
            with probability 0 (cut by top-k or top-p) has no bar.
        highlight: a token whose label is drawn in bold and colour (e.g. the drafted token).

    Returns:
        The token ids shown, top to bottom.
    """
    rows = [d.detach().float().cpu() for d in dists.values()]
    if not rows or any(r.dim() != 1 or r.shape != rows[0].shape for r in rows):
        raise ValueError(f"dists must hold vectors of one shape, got {[tuple(r.shape) for r in rows]}")
    if ids is None:
        ids = torch.stack(rows).amax(0).topk(min(top, rows[0].numel())).indices.tolist()
    ids = [int(i) for i in ids]
    ys = [len(ids) - 1 - r for r in range(len(ids))]  # the first token on top
    height = 0.8 / len(rows)
    for k, (name, row) in enumerate(zip(dists, rows, strict=True)):
        offset = ((len(rows) - 1) / 2 - k) * height  # the first distribution's bar on top
        ax.barh([y + offset for y in ys], row[ids].tolist(), height=height, label=name)
    ax.set_yticks(ys, [_visible(decode([i])) if decode else str(i) for i in ids], family="monospace", fontsize=9)
    if highlight is not None and int(highlight) in ids:
        tick = ax.get_yticklabels()[ids.index(int(highlight))]
        tick.set_fontweight("bold")
        tick.set_color("#b35900")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("probability")
    if len(rows) > 1:  # outside the axes, right of the bars, where it covers none
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, frameon=False)
    return ids


def plot_pass_time(ax, config, *, dtype: str, bandwidth: float, peak_flops: float, context: int = 512,
                   max_tokens: int = 512, label: str = "") -> None:
    """Roofline time of one cached pass against the number of tokens m in it (log-log).

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

    tokens = sorted({round(2 ** (i / 4)) for i in range(int(4 * math.log2(max_tokens)) + 1)})  # m values
    times = [memory.roofline_time(memory.step_flops(config, context=context, num_tokens=m),
                                  memory.step_bytes(config, context=context, dtype=dtype, num_tokens=m).total,
                                  peak_flops=peak_flops, bandwidth=bandwidth) for m in tokens]
    ax.loglog(tokens, [t * 1e3 for t in times], label=label or None)
    ax.set_xlabel("tokens per pass, $m$")
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

    Every token gets a box of the same width, its text shortened with visible whitespace
    (· space, ↵ newline), and its position (n - 1 is the last prefix token) underneath.

    Args:
        ax: a matplotlib axes.
        prefix: the text of the last few prefix tokens (the last one is position n - 1).
        drafts: the text of the K drafted tokens (positions n .. n + K - 1).
    """
    from matplotlib.patches import FancyBboxPatch

    tokens = [*prefix, *drafts, None]  # None: the bonus token, not sampled yet
    first = len(prefix) - 1  # the box of position n - 1, whose logits give p_0
    width, height = 0.86, 0.5  # every box alike, in data units: one unit per position
    styles = {"prefix": dict(fc="#dddddd", ls="-"), "draft": dict(fc="#fdd9b5", ls="-"),
              "bonus": dict(fc="white", ls="--")}
    for j, text in enumerate(tokens):
        kind = "prefix" if j < len(prefix) else ("draft" if text is not None else "bonus")
        ax.add_patch(FancyBboxPatch((j - width / 2, -height / 2), width, height, ec="#555555",
                                    boxstyle="round,pad=0,rounding_size=0.1", **styles[kind]))
        ax.text(j, 0, "?" if text is None else _visible(text, 8), ha="center", va="center",
                family="monospace", fontsize=8)
        shift = j - first  # position n - 1 + shift
        ax.text(j, -0.42, "n" if shift == 1 else f"n {'+' if shift > 1 else '-'} {abs(shift - 1)}",
                ha="center", fontsize=7, color="#555555")
        if first <= j < len(tokens) - 1:
            # The logits at position j are the distribution of the token at j + 1.
            ax.annotate("", xy=(j + 1, height / 2 + 0.02), xytext=(j, height / 2 + 0.02),
                        arrowprops=dict(arrowstyle="->", color="#1f77b4", connectionstyle="arc3,rad=-0.5"))
            ax.text(j + 0.5, 0.85, f"$p_{{{j - first}}}$", ha="center", fontsize=11, color="#1f77b4")
    ax.text(first - 0.5, -0.85, "prompt ...", ha="center", fontsize=9, color="#555555")
    ax.text(first + 1 + (len(drafts) - 1) / 2, -0.85, f"{len(drafts)} drafted tokens", ha="center", fontsize=9,
            color="#b35900")
    ax.text(len(tokens) - 1, -0.85, "bonus", ha="center", fontsize=9, color="#555555")
    ax.set_xlim(-0.6, len(tokens) - 0.4)
    ax.set_ylim(-1.0, 1.2)
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
        Its plain-text form (what a notebook stores besides the widget) is one
        short line naming the sliders, not the widget tree.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    class Explorer(widgets.VBox):
        def __repr__(self) -> str:
            return f"<slider explorer: {', '.join(sliders)}>"

    def redraw(**values) -> None:
        draw(**values)
        plt.show()

    # interactive_output calls redraw once now, capturing the figure in the Output widget.
    output = widgets.interactive_output(redraw, dict(sliders))
    header = [widgets.HTML(f"<p>{description}</p>")] if description else []
    return Explorer([*header, *sliders.values(), output])


# Every chapter imports this module (through specdec_ref.notebook) before it draws.
crisp_inline_figures()

"""Helpers for the book's notebooks; the package itself never imports them.

* `pair`: pick and load the model pair a chapter runs on (`open_pair`);
* `plots`: the recurring figures, the widgets, and `show_source`.
"""

from .pair import CPU_PAIR, GPU_PAIR, PAIR_ENV, BookPair, choose_pair, on_colab, open_pair
from .plots import (
    DPI,
    FIGSIZE,
    figure,
    plot_distributions,
    plot_pass_time,
    plot_roofline,
    plot_timings,
    plot_verification_layout,
    show_source,
    slider_explorer,
)

__all__ = [
    "CPU_PAIR", "DPI", "FIGSIZE", "GPU_PAIR", "PAIR_ENV", "BookPair", "choose_pair", "figure", "on_colab",
    "open_pair", "plot_distributions", "plot_pass_time", "plot_roofline", "plot_timings",
    "plot_verification_layout", "show_source", "slider_explorer",
]

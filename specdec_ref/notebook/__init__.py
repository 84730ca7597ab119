"""Helpers for the book's notebooks; the package itself never imports them.

* `pair`: pick and load the model pair a chapter runs on (`open_pair`);
* `plots`: the recurring figures, the widgets, and `show_source`;
* `glue`: store a computed value for the page's prose (myst-nb's record, without myst-nb).
"""

from .glue import glue
from .pair import (
    CPU_PAIR,
    DTYPE_ENV,
    GPU_PAIR,
    PAIR_ENV,
    THREADS_ENV,
    BookPair,
    choose_pair,
    chosen_dtype,
    cpu_threads,
    on_colab,
    open_pair,
    pair_choice,
)
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
    "BookPair",
    "CPU_PAIR",
    "DPI",
    "DTYPE_ENV",
    "FIGSIZE",
    "GPU_PAIR",
    "PAIR_ENV",
    "THREADS_ENV",
    "choose_pair",
    "chosen_dtype",
    "cpu_threads",
    "figure",
    "glue",
    "on_colab",
    "open_pair",
    "pair_choice",
    "plot_distributions",
    "plot_pass_time",
    "plot_roofline",
    "plot_timings",
    "plot_verification_layout",
    "show_source",
    "slider_explorer",
]

"""The derived values of the claims appendix: `{{calc:name(arguments)}}` in scripts/claims.in.md.

Each function takes the placeholder's sources (`claims.Sources`: `.report(name)` gives a
committed report of specdec_ref/data, `.glued(stem)` a notebook's glued values) and the
placeholder's arguments, Python literals; `CALCS` maps the names the template may use to
them. They compute with the package (`specdec_ref.analysis`, `.memory`, `.bench.report`), so
the appendix's derived figures follow the same code as the chapters.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, Protocol


class Sources(Protocol):
    """What a calculation reads (scripts/claims.py's `Sources`)."""

    def report(self, name: str) -> Any: ...

    def glued(self, stem: str) -> dict[str, Any]: ...


BENCH = "bench-tiny-cpu.json"
SWEEP_GPU = "size-sweep-cuda.json"
XL, GPT2 = "48 x 1600", "12 x 768"  # the sweep's shapes of GPT-2 XL and GPT-2
A100 = {"bandwidth": 2039e9, "peak_flops": 312e12}  # chapter 1's GPU (datasheet)


def best_k(src: Sources, mode: str, lean: bool, impl: str = "specdec_ref") -> int:
    """K of the fastest cached fixed-K arm of one kind in the benchmark."""
    from specdec_ref.bench.report import speedup_by_k

    by_k = speedup_by_k(src.report(BENCH), mode=mode, impl=impl, lean=lean)
    return max(by_k, key=lambda key: by_k[key])


def best_speedup(src: Sources, mode: str, lean: bool, impl: str = "specdec_ref") -> float:
    """Speedup over the fastest `generate` of the arm `best_k` picks."""
    from specdec_ref.bench.report import speedup_by_k

    return speedup_by_k(src.report(BENCH), mode=mode, impl=impl, lean=lean)[best_k(src, mode, lean, impl)]


def ms_per_token(src: Sources, mode: str, name: str) -> float:
    """Milliseconds per token of a benchmark arm (median tokens/s)."""
    arm = next(a for a in src.report(BENCH)["arms"] if a["mode"] == mode and a["name"] == name)
    return 1e3 / arm["tokens_per_s"]["median"]


def bench_v(src: Sources, first: int, last: int, which: str) -> float:
    """The smallest ("min") or largest ("max") measured v(K), K = first..last, in the benchmark."""
    costs = src.report(BENCH)["verify_cost"]
    return {"min": min, "max": max}[which](float(costs[str(k)]) for k in range(first, last + 1))


def tokens_model_gap(src: Sources) -> float:
    """The largest |predicted / measured - 1| of tokens per pass over the benchmark's fixed-K arms."""
    from specdec_ref.bench.report import predicted_vs_measured

    rows = predicted_vs_measured(src.report(BENCH))
    return max(abs(row.predicted_tokens / row.block_efficiency - 1) for row in rows)


def arm_gain(src: Sources, mode: str, name: str, other: str) -> float:
    """How much faster one benchmark arm ran than another, in one mode (a fraction)."""
    return ms_per_token(src, mode, other) / ms_per_token(src, mode, name) - 1


def model_gap(src: Sources, lean: bool | None = None, which: str = "max", field: str = "gap") -> Any:
    """Measured / predicted speedup - 1 of the benchmark's fixed-K arms (lean, plain, or None: all):
    the size of the "min" or "max" gap, or that arm's "k" or "mode"; "within" counts arms within 10 %, "arms" all."""
    from specdec_ref.bench.report import predicted_vs_measured

    rows = [r for r in predicted_vs_measured(src.report(BENCH)) if lean is None or r.lean == lean]
    gaps = {(r.k, r.mode, r.lean): r.measured_speedup / r.predicted_speedup - 1 for r in rows}
    if which in ("within", "arms"):
        return sum(abs(g) <= 0.1 for g in gaps.values()) if which == "within" else len(gaps)
    key = {"min": min, "max": max}[which](gaps, key=lambda k: gaps[k])
    return {"gap": abs(gaps[key]), "k": key[0], "mode": "greedy" if key[1] == "greedy" else "T = 1"}[field]


def headline_gap(src: Sources, mode: str, report: str = BENCH) -> float:
    """How far the fastest arm of a mode falls below the model's prediction for it (a fraction)."""
    best = src.report(report)["headline"][mode]
    return 1 - best["speedup"] / best["predicted_speedup"]


def overhead_range(src: Sources, impl: str, which: str) -> float:
    """The smallest or largest share of time outside the forward passes among an implementation's
    speculative arms."""
    shares = [a["overhead_share"] for a in src.report(BENCH)["arms"] if a["impl"] == impl and a["schedule"]]
    return {"min": min, "max": max}[which](shares)


def _points(src: Sources, report: str = SWEEP_GPU) -> dict[str, dict]:
    return {point["name"]: point for point in src.report(report)["points"]}


def sweep_ms(src: Sources, name: str, report: str = SWEEP_GPU, draft: bool = False) -> float:
    """One decoding step of a shape of a size sweep (or of the tiny draft, timed beside it), in ms."""
    return 1e3 * _points(src, report)[name]["draft_step_s" if draft else "target_step_s"]


def sweep_c(src: Sources, draft: str = GPT2, target: str = XL, report: str = SWEEP_GPU) -> float:
    """c in a size sweep: the step of shape `draft` over `target`'s; "draft": the tiny draft's."""
    if draft == "draft":
        return sweep_ms(src, target, report, True) / sweep_ms(src, target, report)
    return sweep_ms(src, draft, report) / sweep_ms(src, target, report)


def sweep_v(src: Sources, k: int, name: str = XL, which: str = "", *reports: str) -> float:
    """v(K) of one shape of the H200 sweep, or its "min" / "max" over every shape of `reports`."""
    if which:
        values = [float(p["verify_cost"][str(k)]) for r in reports or (SWEEP_GPU,) for p in _points(src, r).values()]
        return {"min": min, "max": max}[which](values)
    return float(_points(src)[name]["verify_cost"][str(k)])


def sweep_params(src: Sources, name: str, unit: float = 1.0, report: str = SWEEP_GPU) -> float:
    """Parameters of a shape of a size sweep, in `unit`s (1e6: millions)."""
    return float(_points(src, report)[name]["parameters"]) / unit


def sweep_speedup(src: Sources, alpha: float, name: str, report: str) -> float:
    """The model's best speedup (K = 1..8) for the tiny draft against one shape of a size sweep."""
    from specdec_ref import analysis

    point = _points(src, report)[name]
    v = {int(key): float(x) for key, x in point["verify_cost"].items()}
    return max(analysis.expected_speedup(alpha, k, sweep_c(src, "draft", name, report), v) for k in range(1, 9))


def pair_speedup(src: Sources, alpha: float, k: int = 0, tokens: float = 0.0) -> float:
    """The model's speedup for GPT-2 -> GPT-2 XL shapes on the H200 (c of the GPT-2-shaped draft,
    not the tiny draft's; v(K) of the XL shape): at K, or the best K in 1..8 when k = 0;
    `tokens` replaces the expected tokens per iteration (e.g. 4 for the article's count)."""
    from specdec_ref import analysis

    v = {int(key): float(x) for key, x in _points(src)[XL]["verify_cost"].items()}
    if tokens:
        return tokens / analysis.iteration_cost(k, sweep_c(src), v)
    return max(analysis.expected_speedup(alpha, j, sweep_c(src), v) for j in ([k] if k else range(1, 9)))


def pair_steps(src: Sources, k: int, drafts_only: bool = False) -> float:
    """K c (drafts only) or K c + v(K): an iteration's cost in target steps, GPT-2 -> GPT-2 XL shapes."""
    return k * sweep_c(src) + (0.0 if drafts_only else sweep_v(src, k))


def pair_best_k(src: Sources, alpha: float) -> int:
    """The K in 1..8 that `pair_speedup` finds fastest at `alpha`."""
    return max(range(1, 9), key=lambda k: pair_speedup(src, alpha, k))


def model_speedup(src: Sources, alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """The performance model alone: E[tokens] / (K c + v)."""
    from specdec_ref import analysis

    return analysis.expected_speedup(alpha, k, c, lambda _: v)


def article_example(src: Sources, field: str, tokens: float = 0.0, pass_ms: float = 100.0) -> float:
    """The article's worked example (tau_p = 100 ms, tau_q = 8 ms, K = 4, alpha = 0.6), computed:
    "tokens" per iteration, "ms" per token or "speedup"; `tokens` replaces E[tokens] (its rounded
    2.2), `pass_ms` the verification pass (its 105 ms)."""
    from specdec_ref import analysis

    tokens = tokens or analysis.expected_tokens(0.6, 4)
    ms = (4 * 8.0 + pass_ms) / tokens
    return {"tokens": tokens, "ms": ms, "speedup": 100.0 / ms}[field]


def optimal_k(src: Sources, alpha: float, c: float, max_k: int = 16) -> int:
    """The K the performance model finds fastest, with v(K) = 1."""
    from specdec_ref import analysis

    return analysis.optimal_draft_length(alpha, c, max_k=max_k)


def glue_ratio(src: Sources, stem: str, numerator: str, denominator: str) -> float:
    """One glued value of a notebook over another."""
    glued = src.glued(stem)
    return glued[numerator] / glued[denominator]


def _llama(size: str) -> Any:
    """Llama 2's published shapes (Touvron et al. 2023): 7B, multi-head; 70B from specdec_ref.memory."""
    from transformers import LlamaConfig

    from specdec_ref import memory

    if size == "70b":
        return memory.llama2_70b_config()
    return LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False)


def llama_gb(src: Sources, size: str, context: int = 0) -> float:
    """GB of Llama 2 `size`'s bf16 weights, plus its keys and values for `context` tokens."""
    from specdec_ref import memory

    config = _llama(size)
    return (memory.weight_bytes(config, "bf16") + memory.kv_cache_bytes(config, context, "bf16")) / 1e9


def llama_pass(src: Sources, size: str, context: int, tokens: int = 1) -> float:
    """Roofline time (s) of a bf16 pass of Llama 2 `size` over `tokens` new tokens on the A100."""
    from specdec_ref import memory

    config = _llama(size)
    return memory.roofline_time(memory.step_flops(config, context=context, num_tokens=tokens),
                                memory.step_bytes(config, context=context, dtype="bf16", num_tokens=tokens).total,
                                **A100)


def llama_pair_gb(src: Sources, context: int = 0) -> float:
    """GB of a Llama 2 7B draft and 70B target in bf16, with `context` tokens of keys and values each."""
    return llama_gb(src, "7b", context) + llama_gb(src, "70b", context)


CALCS: dict[str, Callable[..., Any]] = {function.__name__: function for function in (
    best_k, best_speedup, ms_per_token, bench_v, tokens_model_gap, sweep_ms, sweep_c, sweep_v, sweep_params,
    sweep_speedup, arm_gain, model_gap, headline_gap, overhead_range,
    pair_speedup, pair_steps, pair_best_k, model_speedup, article_example, optimal_k, glue_ratio, llama_gb, llama_pass,
    llama_pair_gb)}
CALCS["llama_v"] = lambda src, context, k: llama_pass(src, "70b", context, k + 1) / llama_pass(src, "70b", context)
CALCS["llama_c"] = lambda src, context: llama_pass(src, "7b", context) / llama_pass(src, "70b", context)


# --- "Using speculative decoding" (book/using-speculative-decoding.md, scripts/using.in.md) -----------

H200_BYTES_PER_S = 4.8e12  # NVIDIA H200 SXM: 4.8 TB/s of HBM3e (datasheet, nvidia2024h200), as in chapter 6


def bench_alpha(src: Sources, lean: bool, mode: str = "greedy", report: str = BENCH) -> float:
    """alpha measured by a benchmark's K = 1 arm of `specdec_ref` (at K = 1 every draft is judged)."""
    name = "specdec_ref k=1" + (" lean" if lean else "")
    arm = next(a for a in src.report(report)["arms"] if a["mode"] == mode and a["name"] == name)
    return arm["alpha_per_token"]


def _bench_costs(src: Sources, lean: bool, report: str = BENCH, flat: bool = False) -> tuple[float, dict[int, float]]:
    """(c, {K: v(K)}) of a benchmark report: the lean draft's c or the `transformers` draft's.

    flat: every v(K), K >= 1, replaced by their mean (`bench_v_mean`): the report's v(K) were
    timed once, and their differences between K are within the noise of that timing."""
    data = src.report(report)
    c = data["lean_cost_ratio" if lean else "cost_ratio"]
    v = {int(k): float(x) for k, x in data["verify_cost"].items()}
    if flat:
        mean = bench_v_mean(src, report=report)
        v = {k: (x if k == 0 else mean) for k, x in v.items()}
    return c, v


def bench_v_mean(src: Sources, which: str = "mean", report: str = BENCH) -> float:
    """The mean of a benchmark's v(K) over K >= 1, or their "min" or "max"."""
    values = [float(x) for k, x in src.report(report)["verify_cost"].items() if int(k) >= 1]
    return {"mean": statistics.fmean, "min": min, "max": max}[which](values)


def bench_model_k(src: Sources, lean: bool, alpha: float = 0.0, max_k: int = 8, report: str = BENCH) -> int:
    """The K in 1..max_k the performance model picks from alpha (0: `bench_alpha`) and a benchmark's
    measured c and v(K)."""
    from specdec_ref import analysis

    c, v = _bench_costs(src, lean, report)
    alpha = alpha or bench_alpha(src, lean, report=report)
    return analysis.optimal_draft_length(alpha, c, max_k=max_k, verify_cost=v)


def bench_model_speedup(src: Sources, lean: bool, k: int | str = 0, alpha: float = 0.0,
                        report: str = BENCH) -> float:
    """The model's speedup with a benchmark's measured c and v(K), at alpha (0: `bench_alpha`) and K
    (0: the K `bench_model_k` picks; "measured": the benchmark's fastest fixed K, greedy)."""
    from specdec_ref import analysis

    c, v = _bench_costs(src, lean, report)
    alpha = alpha or bench_alpha(src, lean, report=report)
    if k == "measured":
        k = best_k(src, "greedy", lean)
    return analysis.expected_speedup(alpha, k or bench_model_k(src, lean, alpha, report=report), c, v)


def break_even_alpha(src: Sources, lean: bool, max_k: int = 8, report: str = BENCH) -> float:
    """The smallest alpha (on a 0.001 grid) at which some K in 1..max_k has a model speedup above 1."""
    from specdec_ref import analysis

    c, v = _bench_costs(src, lean, report)
    return next(a / 1000 for a in range(1, 1001)
                if max(analysis.expected_speedup(a / 1000, k, c, v) for k in range(1, max_k + 1)) > 1)


def flat_model_k(src: Sources, lean: bool, alpha: float = 0.0) -> int:
    """`bench_model_k` with the benchmark's v(K) replaced by their mean over K (a flat v)."""
    from specdec_ref import analysis

    c, v = _bench_costs(src, lean, flat=True)
    return analysis.optimal_draft_length(alpha or bench_alpha(src, lean), c, max_k=max(v), verify_cost=v)


def flat_model_speedup(src: Sources, lean: bool, alpha: float = 0.0) -> float:
    """The model's speedup at `flat_model_k`, with the flat v."""
    from specdec_ref import analysis

    c, v = _bench_costs(src, lean, flat=True)
    alpha = alpha or bench_alpha(src, lean)
    return analysis.expected_speedup(alpha, flat_model_k(src, lean, alpha), c, v)


def flat_break_even_alpha(src: Sources, lean: bool, max_k: int = 8) -> float:
    """`break_even_alpha` with the flat v."""
    from specdec_ref import analysis

    c, v = _bench_costs(src, lean, flat=True)
    return next(a / 1000 for a in range(1, 1001)
                if max(analysis.expected_speedup(a / 1000, k, c, v) for k in range(1, max_k + 1)) > 1)


def h200_over_floor(src: Sources, which: str = "", name: str = "") -> float:
    """An eager bf16 step of the H200 sweep over its bandwidth floor (its weights read once at 4.8 TB/s):
    one target's (`name`), or the "min" / "max" over the sweep."""
    points = _points(src, SWEEP_GPU)
    ratios = {n: p["target_step_s"] / (2 * p["parameters"] / H200_BYTES_PER_S) for n, p in points.items()}
    return ratios[name] if name else {"min": min, "max": max}[which](ratios.values())


def best_k_rows(src: Sources, mode: str, lean: bool, impl: str = "specdec_ref") -> int:
    """K + 1, the rows of a verification pass, for the K that `best_k` finds fastest."""
    return best_k(src, mode, lean, impl) + 1


CALCS.update({function.__name__: function for function in (
    best_k_rows, bench_alpha, bench_model_k, bench_model_speedup, break_even_alpha, h200_over_floor,
    bench_v_mean, flat_model_k, flat_model_speedup, flat_break_even_alpha)})


# --- the machines of the committed reports (the intro's "machines" section) -------------


def report_cpu(src: Sources, name: str) -> str:
    """The processor a report names, or what it recorded of the machine."""
    meta = src.report(name).get("meta", {})
    for key in ("cpu_model", "processor", "device_name", "machine", "cpu"):
        value = meta.get(key)
        if value and value not in ("cpu", "x86_64"):
            return str(value)
    return "not recorded (x86_64)"


def report_isa(src: Sources, name: str) -> str:
    """The instruction sets a report recorded, or what its setting proves of them."""
    meta = src.report(name).get("meta", {})
    flags = meta.get("cpu_flags")
    if flags:
        return ", ".join(flags) if isinstance(flags, list) else str(flags)
    if meta.get("linear") == "packed" and meta.get("dtype") == "bfloat16":
        return "AVX-512 BF16 or AMX (its prepacked bfloat16 ran only there)"
    return "not recorded"


def report_setting(src: Sources, name: str) -> str:
    """dtype and threads of a report's run, as a phrase."""
    meta = src.report(name).get("meta", {})
    threads = meta.get("threads")
    count = f"{threads} thread" + ("s" if threads != 1 else "") if threads else "threads not recorded"
    return f"{meta.get('dtype', 'dtype not recorded')}, {count}"


def report_date(src: Sources, name: str) -> str:
    date = src.report(name).get("meta", {}).get("date")
    return str(date)[:10] if date else "not recorded"


CALCS.update({function.__name__: function for function in (report_cpu, report_isa, report_setting, report_date)})

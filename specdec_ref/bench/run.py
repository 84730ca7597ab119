"""`python -m specdec_ref.bench`: a fair benchmark of speculative decoding against `transformers`.

One process, one pair, one fixed prompt set, one fixed `max_new_tokens`, EOS off so
every arm produces the same number of tokens. Every arm (`arms.build_arms`) is
run once untimed as a warm-up, then `repeats` times over all prompts: for each prompt
all arms in turn, in a round-robin order whose starting arm moves at every prompt and
repetition, so slow drifts of a shared machine (other processes, clock changes)
spread over all arms alike. Each repetition gives one tokens/s figure per arm (all
its tokens over all its seconds); the report gives their median and quartiles, the
speedup over target-only `generate`, alpha, tokens per target call, and the share of
wall time spent outside forward passes.

Invariant: in greedy mode every arm must reproduce the baseline's tokens on every
prompt; the report says whether they did (`greedy_identical`) and lists any mismatch.
The JSON report also carries the pair's measured cost ratio c and verification costs
v(K), which `analysis.predicted_vs_measured` turns into predicted speedups.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

from ..analysis import predicted_vs_measured
from ..timing import Timing
from .arms import MODES, Arm, ArmRunner, RunRecord, assisted_defaults, build_arms
from .pair import RANDOM_SHAPES, RandomPairShape, bench_prompts, load_bench_pair, measure_costs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BASELINE = "hf generate"


@dataclass
class BenchConfig:
    """Everything that defines one benchmark run."""

    pair: str = "tiny"  # "tiny", "random", or another name `models.load_pair` knows
    max_new_tokens: int = 128  # tokens generated per prompt by every arm
    repeats: int = 5  # timed repetitions over all prompts
    k_values: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # fixed K of the cached and assisted arms
    modes: tuple[str, ...] = ("greedy", "t1.0", "t0.7")  # keys of arms.MODES
    num_prompts: int = 8  # prompts in the fixed set
    prompt_tokens: int = 32  # tokens per prompt (random pairs: between half and this)
    nocache_k: int = 4  # K of the specdec_ref arm without a KV cache
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str = "float32"  # a key of DTYPES
    threads: int | None = None  # torch intra-op threads (None: torch's default)
    seed: int = 0  # seeds prompts and sampling
    cost_repeats: int = 20  # timings per measured pass cost
    shape: RandomPairShape = field(default_factory=RandomPairShape)  # shapes of a random pair
    progress: bool = True  # show a progress bar
    lean: bool = True  # add arms whose draft runs through `lean.LeanForward` (Llama-style drafts only)

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "repeats", "num_prompts", "prompt_tokens", "nocache_k", "cost_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be None or >= 1, got {self.threads!r}")
        build_arms(list(self.modes), list(self.k_values), nocache_k=self.nocache_k)  # raises on bad modes / K


def run_benchmark(config: BenchConfig) -> dict:
    """Run every arm and return the report (the dictionary written as JSON)."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pair = load_bench_pair(config.pair, device=device, dtype=DTYPES[config.dtype], shape=config.shape)
    prompts, prompt_source = bench_prompts(pair, config.num_prompts, prompt_tokens=config.prompt_tokens,
                                           seed=config.seed)
    context = max(p.size(1) for p in prompts) + config.max_new_tokens // 2
    costs = measure_costs(pair, context=context, max_k=max(8, *config.k_values), repeats=config.cost_repeats)
    arms = build_arms(list(config.modes), list(config.k_values), nocache_k=config.nocache_k,
                      lean=config.lean and costs.lean_cost_ratio is not None)
    runner = ArmRunner(pair, max_new_tokens=config.max_new_tokens, costs=costs)
    records: dict[Arm, list[tuple[int, int, RunRecord]]] = {arm: [] for arm in arms}
    total = len(arms) * (1 + config.repeats * len(prompts))
    try:
        with tqdm(total=total, desc="bench", unit="run", disable=not config.progress, file=sys.stderr) as bar:
            for arm in arms:  # warm-up: every arm once, untimed
                bar.set_postfix_str(f"warm-up {arm.mode} {arm.name}", refresh=False)
                runner.run(arm, prompts[0], config.seed)
                bar.update()
            slots = config.repeats * len(prompts)
            for repeat in range(config.repeats):
                for index, prompt in enumerate(prompts):
                    # Round robin over the arms, started at a different arm for every (repeat, prompt)
                    # so that each arm takes every place in the order about equally often.
                    shift = (repeat * len(prompts) + index) * len(arms) // slots
                    order = arms[shift:] + arms[:shift]
                    seed = config.seed + 1000 * repeat + index
                    for arm in order:
                        bar.set_postfix_str(f"{arm.mode} {arm.name}", refresh=False)
                        records[arm].append((repeat, index, runner.run(arm, prompt, seed)))
                        bar.update()
    finally:
        runner.close()

    summaries = [summarize(arm, records[arm]) for arm in arms]
    for summary in summaries:
        baseline = next(s for s in summaries if s["mode"] == summary["mode"] and s["name"] == BASELINE)
        summary["speedup"] = summary["tokens_per_s"]["median"] / baseline["tokens_per_s"]["median"]
    mismatches = greedy_mismatches(records)
    report = {
        "meta": {
            "pair": pair.name, "requested_pair": config.pair, "pair_description": pair.description,
            "pair_note": pair.note, "device": str(device),
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.processor() or platform.machine()),
            "dtype": config.dtype, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now().astimezone().isoformat(),
            "prompts": len(prompts), "prompt_source": prompt_source,
            "prompt_lengths": [int(p.size(1)) for p in prompts], "max_new_tokens": config.max_new_tokens,
            "repeats": config.repeats, "threads": torch.get_num_threads(), "k_values": list(config.k_values),
            "modes": list(config.modes), "seed": config.seed, "cost_context": costs.context,
            "target_pass_ms": 1000 * costs.target_seconds,
            "overhead_method": "forward hooks on both models (GPU synchronized at each pass boundary)",
            "hf_assisted_defaults": assisted_defaults(),
        },
        "cost_ratio": costs.cost_ratio,
        "lean_cost_ratio": costs.lean_cost_ratio,
        "loop_cost_ratio": costs.loop_cost_ratio,
        "lean_loop_cost_ratio": costs.lean_loop_cost_ratio,
        "verify_cost": {str(k): v for k, v in costs.verify_cost.items()},
        "arms": summaries,
        "greedy_identical": (not mismatches) if "greedy" in config.modes else None,
        "greedy_mismatches": mismatches,
    }
    report["headline"] = headline(report)
    return report


def headline(report: dict) -> dict:
    """Per mode: the fastest speculative arm, its speedup over `generate` and over assisted
    generation at its best K, its share of time outside the forward passes, and what the
    performance model predicts for it (fixed-K arms; None for a schedule)."""
    predicted = {(row.name, row.mode): row.predicted_speedup for row in predicted_vs_measured(report)}
    out = {}
    for mode in report["meta"]["modes"]:
        arms = [arm for arm in report["arms"] if arm["mode"] == mode and arm["schedule"] is not None]
        ours = max((a for a in arms if a["impl"] == "specdec_ref" and a["use_cache"]), key=lambda a: a["speedup"])
        assisted = max((a for a in arms if a["impl"] == "transformers"), key=lambda a: a["speedup"])
        out[mode] = {"best_arm": ours["name"], "speedup": ours["speedup"], "best_assisted": assisted["name"],
                     "assisted_speedup": assisted["speedup"], "over_assisted": ours["speedup"] / assisted["speedup"],
                     "overhead_share": ours["overhead_share"],
                     "predicted_speedup": predicted.get((ours["name"], mode))}
    return out


def summarize(arm: Arm, runs: list[tuple[int, int, RunRecord]]) -> dict:
    """The report entry of one arm: medians over repetitions, ratios over all runs."""
    by_repeat: dict[int, list[RunRecord]] = {}
    for repeat, _, record in runs:
        by_repeat.setdefault(repeat, []).append(record)
    rates, overheads = [], []
    for group in by_repeat.values():
        wall = sum(r.wall_seconds for r in group)
        rates.append(sum(len(r.tokens) for r in group) / wall)
        overheads.append(1 - sum(r.forward_seconds for r in group) / wall)
    records = [record for _, _, record in runs]
    tokens = sum(len(r.tokens) for r in records)
    target_calls = sum(r.target_calls for r in records)
    drafted = sum(r.drafted or 0 for r in records)
    accepted = sum(r.accepted or 0 for r in records)
    judged = sum(r.judged or 0 for r in records)
    iterations = sum(r.iterations for r in records)
    return {
        "name": arm.name, "impl": arm.impl, "mode": arm.mode, "k": arm.k, "use_cache": arm.use_cache,
        "schedule": arm.schedule, "tokens_per_s": Timing(tuple(rates)).as_dict(), "speedup": None,
        # The issue's acceptance rate: accepted / drafted (comparable across implementations).
        "alpha": accepted / drafted if arm.speculative and drafted else None,
        # Per-token acceptance, accepted / judged drafts: the alpha of the performance model.
        "alpha_per_token": accepted / judged if judged else None,
        "block_efficiency": tokens / target_calls if target_calls else None,
        "target_calls_per_token": target_calls / tokens if tokens else None,
        "overhead_share": Timing(tuple(overheads)).median,
        "mean_k": drafted / iterations if arm.speculative and iterations else None,
        "draft_calls_per_token": sum(r.draft_calls for r in records) / tokens if tokens else None,
        "lean": arm.lean,
        # Mean pass times inside the loop (the draft's pass runs right after the target's, whose
        # weights have just streamed through the CPU caches): the c and v(K) the arm really paid.
        "target_pass_ms": _mean_ms(sum(r.target_seconds for r in records), target_calls),
        "draft_pass_ms": _mean_ms(sum(r.draft_seconds for r in records),
                                  sum(r.draft_calls for r in records)),
    }


def _mean_ms(seconds: float, calls: int) -> float | None:
    return 1000 * seconds / calls if calls else None


def greedy_mismatches(records: dict[Arm, list[tuple[int, int, RunRecord]]]) -> list[dict]:
    """Greedy runs whose tokens differ from the baseline's on the same prompt."""
    reference = {}
    for arm, runs in records.items():
        if arm.mode == "greedy" and arm.name == BASELINE:
            reference = {index: record.tokens for _, index, record in runs}
    mismatches = []
    for arm, runs in records.items():
        if arm.mode != "greedy":
            continue
        for repeat, index, record in runs:
            expected = reference[index]
            if record.tokens != expected:
                first = next(i for i, (a, b) in enumerate(zip(record.tokens, expected, strict=True)) if a != b)
                mismatches.append({"arm": arm.name, "prompt": index, "repeat": repeat, "first_difference": first})
    return mismatches


def format_table(report: dict) -> str:
    """The report as a plain-text table, one block per mode."""
    meta = report["meta"]
    lines = [f"pair: {meta['pair_description']}"]
    if meta["pair_note"]:
        lines.append(f"NOTE: {meta['pair_note']}")
    verify = " ".join(f"{k}:{v:.2f}" for k, v in report["verify_cost"].items())
    lines += [
        f"device {meta['device']} ({meta['dtype']}, {meta['threads']} threads), torch {meta['torch']}, "
        f"transformers {meta['transformers']}",
        f"{meta['prompts']} prompts ({meta['prompt_source']}), {meta['max_new_tokens']} new tokens, "
        f"{meta['repeats']} repeats; target 1-token pass {meta['target_pass_ms']:.2f} ms at context "
        f"{meta['cost_context']}",
        f"cost ratio c = {report['cost_ratio']:.3f}"
        + (f" (lean draft: {report['lean_cost_ratio']:.3f})" if report.get("lean_cost_ratio") else "")
        + f"; verification cost v(K): {verify}",
    ]
    if report.get("loop_cost_ratio"):
        lean = report.get("lean_loop_cost_ratio")
        lines.append(f"c after a target pass, as in the loop = {report['loop_cost_ratio']:.3f}"
                     + (f" (lean draft: {lean:.3f})" if lean else ""))
    if meta.get("hf_assisted_defaults"):
        defaults = meta["hf_assisted_defaults"]
        adapts = "adaptive" if defaults["threshold_adapts"] else "fixed: no scikit-learn"
        lines.append(f"hf assisted default = {defaults['num_assistant_tokens']} tokens, "
                     f"{defaults['num_assistant_tokens_schedule']} schedule, confidence threshold "
                     f"{defaults['assistant_confidence_threshold']} ({adapts}); "
                     "hf assisted k=K: K tokens, constant, no threshold")
    header = (f"{'arm':<28} {'tok/s':>8} {'[q1, q3]':>17} {'speedup':>7} {'alpha':>6} {'a/tok':>6} {'tok/call':>8} "
              f"{'calls/tok':>9} {'mean K':>6} {'overhead':>8}")
    for mode in meta["modes"]:
        lines += ["", f"mode {mode}: {MODES[mode]}", header, "-" * len(header)]
        for arm in (a for a in report["arms"] if a["mode"] == mode):
            tps = arm["tokens_per_s"]
            spread = f"[{tps['q1']:.1f}, {tps['q3']:.1f}]"
            lines.append(
                f"{arm['name']:<28} {tps['median']:>8.1f} {spread:>17} "
                f"{arm['speedup']:>6.2f}x {_fmt(arm['alpha'], 6, '.2f')} {_fmt(arm['alpha_per_token'], 6, '.2f')} "
                f"{_fmt(arm['block_efficiency'], 8, '.2f')} "
                f"{_fmt(arm['target_calls_per_token'], 9, '.2f')} {_fmt(arm['mean_k'], 6, '.1f')} "
                f"{arm['overhead_share']:>8.1%}")
    for mode, best in report.get("headline", {}).items():
        model = best["predicted_speedup"]
        lines += ["", f"{mode}: fastest speculative arm {best['best_arm']}: {best['speedup']:.2f}x over generate, "
                  f"{best['over_assisted']:.2f}x over {best['best_assisted']} ({best['assisted_speedup']:.2f}x), "
                  f"{best['overhead_share']:.1%} outside the forward passes"
                  + (f", model {model:.2f}x" if model is not None and not math.isnan(model) else "")]
    if report["greedy_identical"] is not None:
        verdict = "yes" if report["greedy_identical"] else f"NO, {len(report['greedy_mismatches'])} mismatches"
        lines += ["", f"greedy: every arm produced the baseline's tokens on every prompt: {verdict}"]
    lines.append("alpha = accepted / drafted; a/tok = accepted / judged drafts (the model's per-token alpha)")
    return "\n".join(lines)


def _fmt(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, Path | None]:
    """The command line as a `BenchConfig` and the output path (None: the default)."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny", help="tiny (default), random, or a registry name")
    parser.add_argument("--max-new-tokens", type=int, help="tokens per prompt (default 128; --quick 24)")
    parser.add_argument("--repeats", type=int, help="timed repetitions (default 5; --quick 1)")
    parser.add_argument("--k-values", type=_int_list, help="fixed K values, e.g. 1,2,4 (default 1..8; --quick 2,4)")
    parser.add_argument("--modes", default="greedy,t1.0,t0.7", help="comma-separated subset of greedy,t1.0,t0.7")
    parser.add_argument("--num-prompts", type=int, help="prompts in the set (default 8; --quick 2)")
    parser.add_argument("--prompt-tokens", type=int, help="tokens per prompt (default 32; --quick 16)")
    parser.add_argument("--out", type=Path, help="JSON report path (default bench-results/bench-<pair>.json)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run: few prompts, tokens and K values")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-lean", action="store_true", help="leave out the lean-draft arms")
    parser.add_argument("--random-shape", default="tiny", choices=sorted(RANDOM_SHAPES),
                        help="shapes of a random pair (default: the tiny pair's); --random-* below override them")
    parser.add_argument("--random-target-layers", type=int)
    parser.add_argument("--random-draft-layers", type=int)
    parser.add_argument("--random-width", type=int)
    parser.add_argument("--random-vocab", type=int)
    args = parser.parse_args(argv)
    quick = args.quick
    overrides = {name: getattr(args, f"random_{name}") for name in ("target_layers", "draft_layers", "width", "vocab")}
    shape = replace(RANDOM_SHAPES[args.random_shape],
                    **{name: value for name, value in overrides.items() if value is not None})

    def pick(value, full, short):
        return value if value is not None else (short if quick else full)

    config = BenchConfig(
        pair=args.pair, max_new_tokens=pick(args.max_new_tokens, 128, 24), repeats=pick(args.repeats, 5, 1),
        k_values=pick(args.k_values, BenchConfig.k_values, (2, 4)),
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        num_prompts=pick(args.num_prompts, 8, 2), prompt_tokens=pick(args.prompt_tokens, 32, 16),
        device=args.device, dtype=args.dtype, threads=args.threads, seed=args.seed,
        cost_repeats=5 if quick else 20, progress=not args.no_progress, lean=not args.no_lean,
        shape=shape,
    )
    return config, args.out


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark from the command line: print the table, write the JSON report."""
    config, out = parse_args(argv)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # assisted generation warns on every call
    try:
        report = run_benchmark(config)
    finally:
        transformers.logging.set_verbosity(verbosity)
    out = out or Path("bench-results") / f"bench-{report['meta']['pair']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    print(f"\nwrote {out}")
    return report


"""`python -m specdec_ref.bench.default_path`: the README snippet's speed, measured.

The README's "Use it" snippet is what a user runs first: `load_pair`, `fast.prepare`,
`speculative_generate(fast.target, fast.draft, ...)`. This measures that path, as
written, on held-out prompts that are not the benchmark's (another seed), against:

* the benchmark's best fixed-K arm, configured as the committed report says it ran
  (its dtype, prepacked layers, attention and lean draft, its K), on the same prompts;
* the fastest `generate` of the target alone: the prepared target as it is, the same
  with `scaled_dot_product_attention`, and the float32 target as loaded (what a new
  user would time first); the fastest of the three is the baseline.

Every arm runs on every prompt in every repeat, round robin with a rotating start, so
that a slow drift of the machine touches all of them alike. Each arm's speed is its
throughput over all its runs (tokens / seconds); the snippet is also compared with the
best arm run by run (same prompt, repeat and seed: the median of the time ratios). In
greedy mode the snippet's tokens must equal the prepared target's own `generate`. The
report goes to `specdec_ref/data/`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import transformers

from ..decoder import speculative_generate
from ..drafting import ModelDrafter
from ..fast import LeanForward, prepare
from ..fast.packed import pack_linear_layers
from ..models import load_pair
from ..reports import REPORTS_DIR, read_report
from ..sampling import SamplingConfig
from ..timing import time_call
from .pair import BenchPair, bench_prompts, load_bench_pair, no_eos

# The snippet's sampling, and greedy.
MODES = {"greedy": SamplingConfig(temperature=0.0), "t0.7 top-k 50": SamplingConfig(temperature=0.7, top_k=50)}
BEST_ARM = re.compile(r"specdec_ref k=(\d+)( lean)?$")  # a fixed-K arm of the benchmark


def best_fixed_k_arm(report: dict, mode: str = "greedy") -> dict:
    """The benchmark report's fastest fixed-K `specdec_ref` arm in `mode` (its summary)."""
    arms = [arm for arm in report["arms"] if arm["mode"] == mode and BEST_ARM.match(arm["name"])]
    if not arms:
        raise ValueError(f"the report has no fixed-K specdec_ref arm in mode {mode!r}")
    return max(arms, key=lambda arm: arm["speedup"])


@contextlib.contextmanager
def attention(model, implementation: str) -> Iterator[None]:
    """Run `model` with another attention implementation for a while."""
    before = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def bench_arm_pair(report: dict, name: str) -> tuple[BenchPair, int, bool]:
    """The pair configured as the benchmark's best fixed-K arm ran, its K, and whether it was lean."""
    meta, arm = report["meta"], best_fixed_k_arm(report)
    k, lean = BEST_ARM.match(arm["name"]).groups()
    pair = load_bench_pair(name, dtype=getattr(torch, meta["dtype"]))
    for model in (pair.target_model, pair.draft_model):
        if meta["attention"] not in (None, "sdpa"):
            model.set_attn_implementation(meta["attention"])
        if meta["linear"] == "packed":
            pack_linear_layers(model)
    return pair, int(k), bool(lean)


def measure(*, pair_name: str = "tiny", report_name: str = "bench-tiny-cpu.json", num_prompts: int = 6,
            max_new_tokens: int = 128, repeats: int = 3, seed: int = 1, modes: tuple[str, ...] = tuple(MODES),
            progress: bool = True) -> dict:
    """Time the snippet's path, the benchmark's best fixed-K arm and `generate` (see the module)."""
    report = read_report(report_name)
    bench_pair, k, lean = bench_arm_pair(report, pair_name)
    # The snippet, as the README writes it.
    draft_model, target_model, tokenizer = load_pair(pair_name)
    fast = prepare(draft_model, target_model)
    float32_target = load_pair(pair_name).target_model.eval()  # what a new user times first
    no_eos(fast.target_model, fast.draft_model, float32_target, bench_pair.target_model, bench_pair.draft_model)
    prompts, source = bench_prompts(bench_pair, num_prompts, seed=seed)
    benchmark_prompts, _ = bench_prompts(bench_pair, report["meta"]["prompts"], seed=report["meta"]["seed"])
    shared = sum(any(torch.equal(p, q) for q in benchmark_prompts) for p in prompts)

    def generate(model, ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> list[int]:
        torch.manual_seed(seed)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             **sampling.generate_kwargs())
        return out[0, ids.size(1):].tolist()

    def speculative(target, draft, ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> list[int]:
        out = speculative_generate(target, draft, ids, max_new_tokens=max_new_tokens, num_draft_tokens=k,
                                   sampling=sampling, generator=torch.Generator().manual_seed(seed))
        return out.sequences[0, ids.size(1):].tolist()

    def sdpa_generate(ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> list[int]:
        with attention(fast.target_model, "sdpa"):
            return generate(fast.target_model, ids, sampling, seed)

    def bench_arm(ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> list[int]:
        # As the benchmark runs it: a fresh lean drafter per generation.
        draft = ModelDrafter(LeanForward(bench_pair.draft_model)) if lean else bench_pair.draft_model
        return speculative(bench_pair.target_model, draft, ids, sampling, seed)

    arms: dict[str, Callable[[torch.Tensor, SamplingConfig, int], list[int]]] = {
        "snippet": lambda *args: speculative(fast.target, fast.draft, *args),
        "benchmark's best fixed-K arm": bench_arm,
        "generate, prepared target": lambda *args: generate(fast.target_model, *args),
        "generate, prepared target, sdpa": sdpa_generate,
        "generate, float32 as loaded": lambda *args: generate(float32_target, *args),
    }
    results = {}
    for mode in modes:
        sampling = MODES[mode]
        seconds = {name: [] for name in arms}
        tokens = {name: [] for name in arms}
        for arm in arms.values():  # warm-up
            arm(prompts[0], sampling, seed)
        slots = repeats * len(prompts)
        for repeat in range(repeats):
            for index, ids in enumerate(prompts):
                names = list(arms)
                shift = (repeat * len(prompts) + index) * len(names) // slots
                for name in names[shift:] + names[:shift]:
                    run_seed = seed + 1000 * repeat + index
                    result = []
                    timing = time_call(lambda: result.append(arms[name](ids, sampling, run_seed)),  # noqa: B023
                                       repeats=1, warmup=0)
                    seconds[name].append(timing.median)
                    tokens[name].append(result[0])
                if progress:
                    print(f"{mode}: repeat {repeat + 1}/{repeats}, prompt {index + 1}/{len(prompts)}", file=sys.stderr)
        # Throughput over every run (total tokens / total seconds): a median of pooled runs
        # would jump between prompts, whose acceptance and so speed differ.
        rates = {name: max_new_tokens * len(values) / sum(values) for name, values in seconds.items()}
        # The same prompt, repeat and seed side by side: snippet time / best-arm time.
        paired = torch.tensor(seconds["benchmark's best fixed-K arm"]) / torch.tensor(seconds["snippet"])
        baseline = max((name for name in rates if name.startswith("generate")), key=rates.get)
        results[mode] = {
            "tokens_per_s": rates,
            "baseline": baseline,
            "speedup": {name: rate / rates[baseline] for name, rate in rates.items()},
            "snippet_over_best_arm": rates["snippet"] / rates["benchmark's best fixed-K arm"],
            "snippet_over_best_arm_paired_median": paired.median().item(),
            "same_tokens_as_best_arm": tokens["snippet"] == tokens["benchmark's best fixed-K arm"],
            "greedy_identical": (tokens["snippet"] == tokens["generate, prepared target"]
                                 == tokens["benchmark's best fixed-K arm"]) if sampling.greedy else None,
        }
    return {
        "meta": {
            "pair": pair_name, "device": "cpu", "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now().astimezone().isoformat(),
            "prompts": len(prompts), "prompt_source": f"{source}, seed {seed}",
            "prompts_shared_with_benchmark": shared, "max_new_tokens": max_new_tokens, "repeats": repeats,
            "num_draft_tokens": k, "benchmark_report": report_name,
            "benchmark_best_arm": best_fixed_k_arm(report)["name"],
            "benchmark_best_arm_speedup": best_fixed_k_arm(report)["speedup"],
            "prepare": fast.describe().splitlines(),
        },
        "modes": results,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench.default_path",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny")
    parser.add_argument("--report", default="bench-tiny-cpu.json", help="the benchmark report whose best arm to run")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1, help="the prompts' seed (the benchmark's is 0)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the report (default: specdec_ref/data/default-path-<pair>-cpu.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with torch.no_grad():
        result = measure(pair_name=args.pair, report_name=args.report, num_prompts=args.prompts,
                         max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed,
                         modes=tuple(args.modes))
    out = args.out or REPORTS_DIR / f"default-path-{args.pair}-cpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for mode, row in result["modes"].items():
        print(f"{mode}: baseline {row['baseline']} {row['tokens_per_s'][row['baseline']]:.1f} tokens/s")
        for name, speedup in row["speedup"].items():
            print(f"  {name:<34} {row['tokens_per_s'][name]:7.1f} tokens/s  {speedup:.2f}x")
        print(f"  snippet / best fixed-K arm: {row['snippet_over_best_arm']:.3f} "
              f"(run by run: {row['snippet_over_best_arm_paired_median']:.3f}); "
              f"same tokens as that arm: {row['same_tokens_as_best_arm']}; greedy identical: {row['greedy_identical']}")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()

"""`python -m specdec_ref.bench`: a fair benchmark of speculative decoding against `transformers`.

One process, one pair, one fixed prompt set, one fixed `max_new_tokens`, EOS off so
every arm produces the same number of tokens. Every arm (`arms.build_arms`) is
run once untimed as a warm-up, then `repeats` times over all prompts: for each prompt
all arms in turn, in a round-robin order whose starting arm moves at every prompt and
repetition, so slow drifts of a shared machine (other processes, clock changes)
spread over all arms alike. Each repetition gives one tokens/s figure per arm (all
its tokens over all its seconds); the report gives their median and quartiles, the
speedup over target-only `generate`, alpha, tokens per target call, and the share of
wall time spent outside forward passes. On a CPU both models run with prepacked linear
layers (`packed`, `--linear packed`, the default there) in every arm; `generate` also
runs in the baseline variants of `arms.VARIANTS` that differ from the run (without
prepacking, with sdpa attention, as a float32 copy, on the other thread count), and
the baseline of each mode, speedup 1, is the fastest of them.

Invariant: in greedy mode every arm must reproduce the baseline's tokens on every
prompt; the report says whether they did (`greedy_identical`) and lists any mismatch.
The JSON report also carries the pair's measured cost ratio c and verification costs
v(K), which `report.predicted_vs_measured` turns into predicted speedups.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

from ..fast.batch_invariant import GROUPED, ROWWISE
from ..fast.packed import pack_linear_layers, packing_unsupported
from ..fast.prepared import describe, plan
from ..validation import check_integer
from .arms import VARIANTS, Arm, ArmRunner, RunRecord, assisted_defaults, build_arms
from .fast import compiled_generate_error, fast_section, fast_unsupported, gpt2_shapes_pair, measure_fast_costs
from .pair import (
    RANDOM_SHAPES,
    BenchPair,
    RandomPairShape,
    _prepared,
    bench_prompts,
    load_bench_pair,
    measure_costs,
)
from .summary import BASELINE, greedy_mismatches, headline, summarize
from .table import format_table
from .trees import DEFAULT_TREES, parse_trees, tree_label, tree_section

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The baseline of each mode: the fastest of target-only `generate` with the models as run and
# its variants (`arms.VARIANTS`): the baseline's fastest configuration.
BASELINES = (BASELINE, *(f"{BASELINE} {variant}" for variant in VARIANTS), "specdec_ref autoregressive fast")
ATTENTIONS = ("sdpa", "eager", ROWWISE, GROUPED)  # both models' attention implementation (None: as loaded)
LINEAR_KINDS = ("auto", "packed", "plain")  # `packed`: every arm's models run `packed.PackedLinear` layers


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
    linear: str = "auto"  # a key of LINEAR_KINDS; auto: packed where `packed.packing_unsupported` allows
    attention: str | None = None  # one of ATTENTIONS for both models (None: as loaded, sdpa)
    fast: bool | None = None  # fast-path arms (`bench.fast`); None: on a GPU, where the pair allows
    compiled: bool | None = None  # a torch.compile'd `generate` baseline; None: on a GPU
    fast_k_values: tuple[int, ...] | None = None  # fixed K of the fast arms (None: k_values)
    trees: tuple = ()  # tree shapes (`bench.trees`): a tree arm each, next to the chain arms

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "repeats", "num_prompts", "prompt_tokens", "nocache_k", "cost_repeats"):
            value = getattr(self, name)
            check_integer(name, value, minimum=1)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be None or >= 1, got {self.threads!r}")
        if self.linear not in LINEAR_KINDS:
            raise ValueError(f"linear must be one of {LINEAR_KINDS}, got {self.linear!r}")
        if self.attention is not None and self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be None or one of {ATTENTIONS}, got {self.attention!r}")
        build_arms(list(self.modes), list(self.k_values), nocache_k=self.nocache_k)  # raises on bad modes / K


def run_benchmark(config: BenchConfig, models: tuple | None = None) -> dict:
    """Run every arm and return the report (the dictionary written as JSON).

    Args:
        config: the run.
        models: (draft_model, target_model, tokenizer) already loaded (a chapter's pair),
            used instead of loading `config.pair` again: no second copy of the target in
            memory. They run as they are (so `config.linear` must be "plain" and
            `config.attention` None) and get their generation configs back afterwards.
    """
    if models is None:
        return _run(config, None)
    if config.linear != "plain" or config.attention is not None:
        raise ValueError("models are run as they are: pass linear='plain' and attention=None, got "
                         f"linear={config.linear!r}, attention={config.attention!r}")
    draft, target, tokenizer = models
    saved = {model: model.generation_config for model in (draft, target)}
    for model in saved:  # no_eos changes a copy
        model.generation_config = copy.deepcopy(model.generation_config)
    try:
        return _run(config, _prepared(BenchPair(target, draft, tokenizer, config.pair,
                                                f"the {config.pair} pair, as loaded")))
    finally:
        for model, generation_config in saved.items():
            model.generation_config = generation_config


def _run(config: BenchConfig, pair: BenchPair | None) -> dict:
    """`run_benchmark` on `pair`, or on the pair `config` names when None."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if pair is not None:
        device = pair.device
    elif config.pair in ("gpt2-shapes", "gpt2-shapes-small"):  # random GPT-2 / GPT-2 XL shapes (bench.fast)
        pair = gpt2_shapes_pair(device=device, dtype=DTYPES[config.dtype], small=config.pair.endswith("small"))
    else:
        pair = load_bench_pair(config.pair, device=device, dtype=DTYPES[config.dtype], shape=config.shape)
    # What `fast.prepare` would choose for this pair as loaded (the README snippet's path).
    prepared = describe(device, plan(pair.draft_model, pair.target_model).choices).splitlines()
    # The "float32" baseline variant: generate on a float32 copy, as loaded (made before packing).
    float32_target = None
    if device.type == "cpu" and config.dtype != "float32":
        float32_target = copy.deepcopy(pair.target_model).float().eval()
    if config.attention is not None:
        for model in (pair.target_model, pair.draft_model):
            model.set_attn_implementation(config.attention)
    linear = _pack(pair, config.linear)
    # The other thread count on a CPU: one thread if the run uses more, two if it uses one.
    threads, cores = torch.get_num_threads(), os.cpu_count() or 1
    wanted = {"plain": linear == "packed", "sdpa": config.attention not in (None, "sdpa"),
              "float32": float32_target is not None, "1 thread": device.type == "cpu" and threads > 1,
              "2 threads": device.type == "cpu" and threads == 1 and cores >= 2}
    variants = tuple(name for name, chosen in wanted.items() if chosen)
    prompts, prompt_source = bench_prompts(pair, config.num_prompts, prompt_tokens=config.prompt_tokens,
                                           seed=config.seed)
    context = max(p.size(1) for p in prompts) + config.max_new_tokens // 2
    costs = measure_costs(pair, context=context, max_k=max(8, *config.k_values), repeats=config.cost_repeats)
    fast = (device.type == "cuda" if config.fast is None else config.fast) and fast_unsupported(pair) is None
    fast_costs = compile_error = None
    fast_k = list(config.fast_k_values or config.k_values)
    if fast:
        fast_costs = measure_fast_costs(pair, context=context, max_k=max(8, *fast_k), repeats=config.cost_repeats)
    if device.type == "cuda" if config.compiled is None else config.compiled:
        compile_error = compiled_generate_error(pair, prompts[0], config.max_new_tokens)
        variants += () if compile_error else ("compiled",)
    arms = build_arms(list(config.modes), list(config.k_values), nocache_k=config.nocache_k,
                      lean=config.lean and costs.lean_cost_ratio is not None, variants=variants, fast=fast,
                      fast_k_values=fast_k, trees=config.trees)
    max_length = max(p.size(1) for p in prompts) + config.max_new_tokens
    runner = ArmRunner(pair, max_new_tokens=config.max_new_tokens, costs=costs, float32_target=float32_target,
                       fast_costs=fast_costs, max_length=max_length if fast else None)
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
    baselines = {mode: max((s for s in summaries if s["mode"] == mode and s["name"] in BASELINES),
                           key=lambda s: s["tokens_per_s"]["median"]) for mode in config.modes}
    for summary in summaries:
        summary["speedup"] = (summary["tokens_per_s"]["median"]
                              / baselines[summary["mode"]]["tokens_per_s"]["median"])
    mismatches = greedy_mismatches(records)
    report_baselines = {mode: summary["name"] for mode, summary in baselines.items()}
    report = {
        "meta": {
            "pair": pair.name, "requested_pair": config.pair, "pair_description": pair.description,
            "device": str(device),
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.processor() or platform.machine()),
            "dtype": config.dtype, "linear": linear,
            "attention": pair.target_model.config._attn_implementation,
            "baseline_variants": {f"{BASELINE} {v}": VARIANTS[v] for v in variants},
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now().astimezone().isoformat(),
            "prompts": len(prompts), "prompt_source": prompt_source,
            "prompt_lengths": [int(p.size(1)) for p in prompts], "max_new_tokens": config.max_new_tokens,
            "repeats": config.repeats, "threads": torch.get_num_threads(), "k_values": list(config.k_values),
            "onednn_kernel_cache": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
            "modes": list(config.modes), "seed": config.seed, "cost_context": costs.context,
            "target_pass_ms": 1000 * costs.target_seconds,
            "overhead_method": "forward hooks on both models (GPU synchronized at each pass boundary)",
            "hf_assisted_defaults": assisted_defaults(), "fast": fast, "compiled_generate_error": compile_error,
            "prepare": prepared, "trees": [tree_label(shape) for shape in config.trees],
        },
        "cost_ratio": costs.cost_ratio,
        "lean_cost_ratio": costs.lean_cost_ratio,
        "loop_cost_ratio": costs.loop_cost_ratio,
        "lean_loop_cost_ratio": costs.lean_loop_cost_ratio,
        "verify_cost": {str(k): v for k, v in costs.verify_cost.items()},
        "baselines": report_baselines,
        "arms": summaries,
        "greedy_identical": (not mismatches) if "greedy" in config.modes else None,
        "greedy_mismatches": mismatches,
        "fast_path": fast_section(fast_costs, summaries, report_baselines, max_k=max(fast_k)) if fast else None,
        "trees": tree_section(arms, records, summaries, report_baselines) if config.trees else None,
    }
    report["headline"] = headline(report)
    return report


def _pack(pair, kind: str) -> str:
    """Prepack both models' linear layers when `kind` asks (or allows: auto); returns what was done."""
    reason = packing_unsupported(pair.target_model)
    if kind == "plain" or (kind == "auto" and reason is not None):
        return "plain"
    for model in (pair.target_model, pair.draft_model):
        pack_linear_layers(model)  # raises with the reason when kind == "packed" cannot be done
    return "packed"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _trees(text: str) -> tuple:
    try:
        return parse_trees(text)
    except ValueError as error:
        raise SystemExit(f"--trees: {error}") from None


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, Path | None]:
    """The command line as a `BenchConfig` and the output path (None: the default)."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny", help="tiny (default), random, gpt2-shapes (random GPT-2 -> "
                        "GPT-2 XL shapes; gpt2-shapes-small for a dry run), or a registry name")
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
    parser.add_argument("--linear", default="auto", choices=LINEAR_KINDS,
                        help="packed: oneDNN-prepacked linear layers in both models, every arm "
                             "(default auto: packed on a CPU that supports it)")
    parser.add_argument("--attention", choices=ATTENTIONS,
                        help=f"both models' attention implementation (default: as loaded, sdpa); {ROWWISE} "
                             f"and {GROUPED} (`specdec_ref.fast.batch_invariant`) keep each row of a K + 1-token pass "
                             "bitwise equal to a one-token step's, so greedy stays exact in bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run: few prompts, tokens and K values")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-lean", action="store_true", help="leave out the lean-draft arms")
    parser.add_argument("--fast", action=argparse.BooleanOptionalAction, default=None,
                        help="arms on the fast path (static cache, CUDA graphs; default: on a GPU)")
    parser.add_argument("--fast-k-values", type=_int_list, help="fixed K values of the fast arms (default: --k-values)")
    parser.add_argument("--trees", nargs="?", const="default", default=None,
                        help="tree arms (`specdec_ref.tree`): shapes 'w1,w2,...' (children per node and level) or "
                             "'cn1,n2,.../top' (nodes per level by the draft's confidence), ';'-separated "
                             "(no value: " + "; ".join(tree_label(t) for t in DEFAULT_TREES) + ")")
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
        device=args.device, dtype=args.dtype, threads=args.threads, seed=args.seed, linear=args.linear,
        attention=args.attention,
        cost_repeats=5 if quick else 20, progress=not args.no_progress, lean=not args.no_lean, fast=args.fast,
        fast_k_values=args.fast_k_values,
        shape=shape,
        trees=() if args.trees is None else DEFAULT_TREES if args.trees == "default" else _trees(args.trees),
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


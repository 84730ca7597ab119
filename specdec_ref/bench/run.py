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

import copy
import json
import os
import sys
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

from ..fast.packed import pack_linear_layers, packing_unsupported
from ..fast.prepared import describe, plan
from ..peer import call_peer
from .arms import Arm, ArmRunner, RunRecord, build_arms
from .config import DTYPES, BenchConfig, BenchSetup, parse_args
from .fast import compiled_generate_error, fast_unsupported, gpt2_shapes_pair, measure_fast_costs
from .pair import (
    BenchPair,
    _prepared,
    bench_prompts,
    load_bench_pair,
    measure_costs,
)
from .summary import BASELINES, greedy_mismatches, make_report
from .table import format_table

__all__ = ["BASELINES", "BenchConfig", "BenchSetup", "build", "format_table", "greedy_mismatches", "main",
           "parse_args", "run_arms", "run_benchmark"]

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
    setup = build(config, pair)
    try:
        records = run_arms(config, setup)
    finally:
        setup.runner.close()
    return make_report(config, setup, records)


def build(config: BenchConfig, pair: BenchPair | None) -> BenchSetup:
    """Load (or take) the pair, prepare it as `config` asks, choose the baseline
    variants, draw the prompts, measure the costs and list the arms."""
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
    return BenchSetup(pair, device, prepared, linear, variants, prompts, prompt_source, costs, fast, fast_costs,
                      fast_k, compile_error, arms, runner)


def run_arms(config: BenchConfig, setup: BenchSetup) -> dict[Arm, list[tuple[int, int, RunRecord]]]:
    """The timed loop: every arm once untimed, then `repeats` rounds over the prompts,
    the arms in a round-robin order; each arm's (repeat, prompt index, record)s.

    An assisted-generation arm of `transformers` that crashes, in its warm-up or later, is
    a finding: it is recorded in `setup.peer_crashes` (the report's `meta`), runs no more
    and is dropped from `setup.arms` and the records; the other arms run on."""
    arms, prompts = list(setup.arms), setup.prompts
    records: dict[Arm, list[tuple[int, int, RunRecord]]] = {arm: [] for arm in arms}
    total = len(arms) * (1 + config.repeats * len(prompts))
    with tqdm(total=total, desc="bench", unit="run", disable=not config.progress, file=sys.stderr) as bar:
        for arm in arms:  # warm-up: every arm once, untimed
            bar.set_postfix_str(f"warm-up {arm.mode} {arm.name}", refresh=False)
            _run_arm(setup, arm, prompts[0], config.seed)
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
                    record = _run_arm(setup, arm, prompt, seed)
                    if record is not None:
                        records[arm].append((repeat, index, record))
                    bar.update()
    crashed = {(crash["arm"], crash["mode"]) for crash in setup.peer_crashes}
    setup.arms = [arm for arm in arms if (arm.name, arm.mode) not in crashed]
    return {arm: records[arm] for arm in setup.arms}


def _run_arm(setup: BenchSetup, arm: Arm, prompt: torch.Tensor, seed: int) -> RunRecord | None:
    """One run of `arm`; None when it is an assisted arm of `transformers` that has crashed
    (now, recorded in `setup.peer_crashes`, or before)."""
    if not (arm.impl == "transformers" and arm.speculative):
        return setup.runner.run(arm, prompt, seed)
    if any((crash["arm"], crash["mode"]) == (arm.name, arm.mode) for crash in setup.peer_crashes):
        return None
    outcome = call_peer(f"generate(assistant_model=...), arm {arm.name!r}, {arm.mode}",
                        setup.runner.run, arm, prompt, seed)
    if outcome.crashed:  # the peer's crash is a finding of the report
        print(outcome.finding(), file=sys.stderr)
        setup.peer_crashes.append({"arm": arm.name, "mode": arm.mode, "called": outcome.called,
                                   "transformers": outcome.version, "error": outcome.error})
    return outcome.value


def _pack(pair, kind: str) -> str:
    """Prepack both models' linear layers when `kind` asks (or allows: auto); returns what was done."""
    reason = packing_unsupported(pair.target_model)
    if kind == "plain" or (kind == "auto" and reason is not None):
        return "plain"
    for model in (pair.target_model, pair.draft_model):
        pack_linear_layers(model)  # raises with the reason when kind == "packed" cannot be done
    return "packed"


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


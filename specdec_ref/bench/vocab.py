"""Drafting with another tokenizer, timed on the tiny target: what a mismatched vocabulary costs (chapter 9).

On one CPU thread, K = 4, held-out prompts, greedy and temperature 1, four arms:
the target alone (`autoregressive_generate`), the same-tokenizer tiny draft
(`speculative_generate(target, draft)`), and the draft with its own tokenizer
(`load_pair("tiny-cross")`) through `cross_drafting.TextDrafter` and through
`cross_drafting.SharedVocabDrafter`. The arms are interleaved in rounds, after an
untimed warm-up round, each round in another order, so the machine's noise hits
every arm alike. A `meter.ForwardMeter` books each model's forward time; the cross
drafters book their re-tokenization (`retokenize_seconds`).

Chapter 6's model predicts each arm's speedup from its alpha and its cost ratio
c: E[tokens] / (K c + v(K)), with E[tokens] = (1 - alpha^(K+1)) / (1 - alpha). A
cross drafter pays more than K c per round: it re-reads the changed text, the text
drafter writes more draft tokens than it proposes, and both decode and re-encode
text. `as_run` puts those in the denominator, measured, in target steps.

Invariant: greedy arms emit the target's greedy tokens (counted and recorded; `main`
fails after writing the report otherwise); the models' counts are exact, times noisy.

Usage: python -m specdec_ref.bench.vocab [--out specdec_ref/data/bench-vocab-tiny-cpu.json] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel

from ..analysis import expected_tokens, verify_cost_from_latency
from ..cross_vocab.drafting import SharedVocabDrafter, TextDrafter
from ..decoder import GenerationOutput, autoregressive_generate, speculative_generate
from ..measure import measure_pass_latency
from ..models import CrossPair, load_pair
from ..reports import REPORTS_DIR
from ..sampling import SamplingConfig
from ..timing import cpu_name
from ..training.corpus import held_out_prompts
from .meter import ForwardMeter

MODES = {"greedy": SamplingConfig(temperature=0.0), "t1.0": SamplingConfig(temperature=1.0)}
ARMS = ("target", "same_tokenizer", "text", "shared_vocab")  # the target alone, then three drafts
CROSS_ARMS = ("text", "shared_vocab")  # the arms whose draft has its own tokenizer
DEFAULT_OUT = REPORTS_DIR / "bench-vocab-tiny-cpu.json"


@dataclass
class VocabBenchConfig:
    """What defines a run."""

    num_prompts: int = 8  # held-out prompts
    prompt_tokens: int = 32  # tokens per prompt
    max_new_tokens: int = 64  # tokens per call (EOS off: every call emits this many)
    num_draft_tokens: int = 4  # K
    repeats: int = 3  # timed rounds over every (prompt, mode, arm)
    modes: tuple[str, ...] = ("greedy", "t1.0")  # keys of MODES
    cost_repeats: int = 20  # timed passes per measured pass size (c, v(K))
    seed: int = 0  # seeds the prompts and the sampled calls
    threads: int = 1  # torch threads


@dataclass
class VocabBench:
    """What `build` made: the models, prompts, drafters and the meter."""

    config: VocabBenchConfig
    pair: CrossPair  # the tiny target with the own-vocabulary draft, and both tokenizers
    same_draft: PreTrainedModel  # the tiny pair's draft (the target's tokenizer)
    prompts: list[torch.Tensor]  # each (1, prompt_tokens)
    drafters: dict[tuple[str, str], object]  # (mode, cross arm) -> its drafter
    meter: ForwardMeter  # forward passes booked as "target" or "draft"
    costs: dict = field(default_factory=dict)  # c of each draft, v(K): `measure_costs`


def build(config: VocabBenchConfig = VocabBenchConfig()) -> VocabBench:
    """Load both pairs on the CPU, cut the prompts, make one drafter per (mode, cross arm)."""
    for name in ("num_prompts", "prompt_tokens", "max_new_tokens", "num_draft_tokens", "repeats", "threads"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
    unknown = set(config.modes) - set(MODES)
    if unknown:
        raise ValueError(f"modes must be keys of {sorted(MODES)}, got {sorted(unknown)}")
    torch.set_num_threads(config.threads)
    pair = load_pair("tiny-cross", device="cpu")
    same_draft = load_pair("tiny", device="cpu").draft_model
    prompts = held_out_prompts(pair.tokenizer, num_prompts=config.num_prompts,
                               prompt_tokens=config.prompt_tokens, seed=config.seed)
    k = config.num_draft_tokens
    drafters = {}
    for mode in config.modes:
        drafters[mode, "text"] = TextDrafter(pair.draft_model, pair.tokenizer, pair.draft_tokenizer, k)
        drafters[mode, "shared_vocab"] = SharedVocabDrafter(pair.draft_model, pair.tokenizer, pair.draft_tokenizer,
                                                            sampling=MODES[mode], num_draft_tokens=k)
    meter = ForwardMeter({"target": pair.target_model, "draft": pair.draft_model, "same_draft": same_draft},
                         torch.device("cpu"))
    return VocabBench(config, pair, same_draft, prompts, drafters, meter)


def measure_costs(bench: VocabBench) -> dict:
    """c of each draft (one cached 1-token step over the target's) and the target's v(K),
    at the context halfway through a call; the sizes timed in turn (`measure_pass_latency`)."""
    config = bench.config
    context = config.prompt_tokens + config.max_new_tokens // 2
    with bench.meter.paused():
        sizes = tuple(range(1, config.num_draft_tokens + 2))
        target = measure_pass_latency(bench.pair.target_model, context=context, num_tokens=sizes,
                                      repeats=config.cost_repeats, seed=config.seed)
        steps = {name: measure_pass_latency(model, context=context, num_tokens=(1,), repeats=config.cost_repeats,
                                            seed=config.seed).median_s[0]
                 for name, model in (("cross", bench.pair.draft_model), ("same", bench.same_draft))}
    step = target.median_s[0]
    return {"context": context, "target_step_s": step, "cross_draft_step_s": steps["cross"],
            "same_draft_step_s": steps["same"], "cost_ratio": {"cross": steps["cross"] / step,
                                                                "same": steps["same"] / step},
            "verify_cost": verify_cost_from_latency(target.num_tokens, target.median_s)}


def run_call(bench: VocabBench, mode: str, arm: str, prompt: torch.Tensor, seed: int) -> dict:
    """One timed generation of one arm: its seconds, its counts, where its time went, its tokens."""
    config, target = bench.config, bench.pair.target_model
    sampling, generator = MODES[mode], torch.Generator().manual_seed(seed)
    common = {"max_new_tokens": config.max_new_tokens, "sampling": sampling, "generator": generator}
    drafter = bench.drafters.get((mode, arm))
    if drafter is not None:  # the drafter keeps its state between calls; start it afresh
        drafter.retokenize_seconds = 0.0
        drafter.generator = generator
    bench.meter.reset()
    start = time.perf_counter()
    if arm == "target":
        out: GenerationOutput = autoregressive_generate(target, prompt, **common)
    elif arm == "same_tokenizer":
        out = speculative_generate(target, bench.same_draft, prompt, num_draft_tokens=config.num_draft_tokens,
                                   **common)
    else:
        out = speculative_generate(target, drafter, prompt, num_draft_tokens=config.num_draft_tokens, **common)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "stats": out.stats, "sequence": out.sequences,
            "target_s": bench.meter.seconds["target"],
            "draft_s": bench.meter.seconds["draft"] + bench.meter.seconds["same_draft"],
            "retokenize_s": drafter.retokenize_seconds if drafter is not None else 0.0}


def run(bench: VocabBench, progress: bool = True) -> dict:
    """Time every (mode, arm) on every prompt, `repeats` interleaved rounds after a warm-up.

    Returns:
        {(mode, arm): [one list of calls per prompt]}, each call as `run_call` returns it.
    """
    config = bench.config
    combos = [(mode, arm) for mode in config.modes for arm in ARMS]
    for mode, arm in combos:  # warm-up: one untimed call of each
        run_call(bench, mode, arm, bench.prompts[0], config.seed)
    calls = {combo: [[] for _ in bench.prompts] for combo in combos}
    for repeat in range(config.repeats):
        for index, prompt in enumerate(bench.prompts):
            shift = (index + repeat) % len(combos)
            for mode, arm in combos[shift:] + combos[:shift]:  # another order every round
                seed = config.seed * 1_000_003 + 1000 * repeat + index
                calls[mode, arm][index].append(run_call(bench, mode, arm, prompt, seed))
        if progress:
            print(f"round {repeat + 1} of {config.repeats} done", flush=True)
    return calls


def summarize(bench: VocabBench, calls: dict) -> dict:
    """Per mode and arm: exact counts over every timed call, times as sums of per-prompt medians."""
    config, k, costs = bench.config, bench.config.num_draft_tokens, bench.costs
    summary = {}
    for mode in config.modes:
        greedy_reference = [runs[0]["sequence"] for runs in calls[mode, "target"]]
        baseline = sum(statistics.median(c["seconds"] for c in runs) for runs in calls[mode, "target"])
        block = {}
        for arm in ARMS:
            runs = [c for per_prompt in calls[mode, arm] for c in per_prompt]
            stats = [c["stats"] for c in runs]
            total = {name: sum(getattr(s, name) for s in stats) for name in
                     ("new_tokens", "iterations", "drafted_tokens", "accepted_tokens", "judged_tokens",
                      "target_calls", "draft_calls")}
            wall = sum(c["seconds"] for c in runs)
            median_s = sum(statistics.median(c["seconds"] for c in per_prompt) for per_prompt in calls[mode, arm])
            tokens_per_prompt = total["new_tokens"] / len(runs)
            entry = {
                "calls": len(runs), **total,
                "tokens_per_target_call": total["new_tokens"] / total["target_calls"],
                "alpha": total["accepted_tokens"] / total["judged_tokens"] if total["judged_tokens"] else None,
                "acceptance_rate": total["accepted_tokens"] / total["drafted_tokens"] if total["drafted_tokens"]
                else None,
                "drafted_per_round": total["drafted_tokens"] / total["iterations"],
                "draft_calls_per_round": total["draft_calls"] / total["iterations"],
                "ms_per_token": 1e3 * median_s / (tokens_per_prompt * len(bench.prompts)),
                "speedup": baseline / median_s,
                # Where the wall time of all timed calls went.
                "share_target_forward": sum(c["target_s"] for c in runs) / wall,
                "share_draft_forward": sum(c["draft_s"] for c in runs) / wall,
                "share_retokenize": sum(c["retokenize_s"] for c in runs) / wall,
            }
            entry["share_other"] = max(0.0, 1 - entry["share_target_forward"] - entry["share_draft_forward"]
                                       - entry["share_retokenize"])
            if mode == "greedy":
                entry["greedy_matches_target"] = sum(
                    torch.equal(c["sequence"], greedy_reference[i]) for i, per_prompt in
                    enumerate(calls[mode, arm]) for c in per_prompt)
            if arm != "target":
                entry["model"] = predict(entry, k, costs["cost_ratio"]["same" if arm == "same_tokenizer" else "cross"],
                                         costs, sum(c["retokenize_s"] for c in runs) / total["iterations"])
            block[arm] = entry
        summary[mode] = block
    return summary


def _verify_cost(table: dict[int, float], k: float) -> float:
    """v at a fractional K, linear between the measured sizes (a round proposes K' <= K)."""
    low = min(int(k), max(table))
    high = min(low + 1, max(table))
    return table[low] + (k - low) * (table[high] - table[low])


def predict(entry: dict, k: int, cost_ratio: float, costs: dict, retokenize_s_per_round: float) -> dict:
    """Chapter 6's prediction from the arm's alpha and c, beside the measured.

    `chapter6`: E[tokens](alpha, K) / (K c + v(K)). `as_run`: the measured tokens per
    target call over the round's measured cost in target steps: the draft calls it
    made (d c, d often > K for a cross draft), v at the drafts it proposed, and the
    re-tokenization's seconds over one target step.
    """
    alpha, table = entry["alpha"], {int(key): value for key, value in costs["verify_cost"].items()}
    tokens = expected_tokens(alpha, k)
    nominal_cost = k * cost_ratio + table[k]
    retokenize_steps = retokenize_s_per_round / costs["target_step_s"]
    as_run_cost = (entry["draft_calls_per_round"] * cost_ratio + _verify_cost(table, entry["drafted_per_round"])
                   + retokenize_steps)
    return {"cost_ratio": cost_ratio, "expected_tokens_per_target_call": tokens,
            "predicted_speedup": tokens / nominal_cost, "round_cost_nominal_steps": nominal_cost,
            "round_cost_as_run_steps": as_run_cost, "retokenize_steps_per_round": retokenize_steps,
            "as_run_speedup": entry["tokens_per_target_call"] / as_run_cost,
            "measured_speedup": entry["speedup"]}


def report(bench: VocabBench, summary: dict, seconds: float) -> dict:
    """The JSON report: what ran, on what, then the costs and the arms."""
    config = bench.config
    return {
        "meta": {
            "what": "drafting with another tokenizer (chapter 9): the tiny target alone, its same-tokenizer draft, "
                    "and the own-vocabulary draft through TextDrafter and SharedVocabDrafter",
            "script": f"python -m specdec_ref.bench.vocab --repeats {config.repeats} "
                      f"--num-prompts {config.num_prompts}",
            "pair": "tiny target (12.6M, 4096-token byte-level BPE); same-tokenizer draft 'tiny' (1.9M); "
                    "own-vocabulary draft 'tiny-cross' (1.6M, 3072-token SentencePiece-style BPE)",
            "device": "cpu", "machine": cpu_name(), "dtype": str(bench.pair.target_model.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "niceness": os.nice(0), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now().astimezone().isoformat(), "seconds": round(seconds, 1),
            "config": asdict(config), "eos": "off (every call emits max_new_tokens)",
            "prompts": f"held_out_prompts(target tokenizer, num_prompts={config.num_prompts}, "
                       f"prompt_tokens={config.prompt_tokens}, seed={config.seed})",
            "timing": "speedup and ms_per_token: sums over prompts of each prompt's median over repeats; counts "
                      "and alpha (accepted / judged drafts) over every timed call; shares over every timed call's "
                      "wall time",
            "note": "2-core machine shared with other jobs: timings are noisy; counts are exact",
        },
        "costs": bench.costs,
        "arms": summary,
    }


def parse_args(argv: list[str] | None = None) -> tuple[VocabBenchConfig, Path]:
    """The command line as a config and the output path."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench.vocab", description=__doc__.split("\n")[0])
    defaults = VocabBenchConfig()
    for name in ("num_prompts", "prompt_tokens", "max_new_tokens", "num_draft_tokens", "repeats", "cost_repeats",
                 "seed", "threads"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--modes", default=",".join(defaults.modes), help="comma-separated subset of greedy,t1.0")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    args["modes"] = tuple(m.strip() for m in args["modes"].split(",") if m.strip())
    return VocabBenchConfig(**args), out


def run_benchmark(config: VocabBenchConfig, progress: bool = True) -> dict:
    """build, measure the costs, run, summarize: the report."""
    started = time.perf_counter()
    bench = build(config)
    bench.costs = measure_costs(bench)
    calls = run(bench, progress)
    return report(bench, summarize(bench, calls), time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    """Run, write the report, print its table; fail if a greedy arm left the target's tokens."""
    config, out = parse_args(argv)
    data = run_benchmark(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"c: cross {data['costs']['cost_ratio']['cross']:.3f}, same {data['costs']['cost_ratio']['same']:.3f}")
    for mode, block in data["arms"].items():
        for arm, e in block.items():
            model = e.get("model", {})
            print(f"{mode:7} {arm:15} tokens/call {e['tokens_per_target_call']:.2f}  alpha {e['alpha'] or 0:.3f}  "
                  f"ms/token {e['ms_per_token']:.2f}  speedup {e['speedup']:.2f}  predicted "
                  f"{model.get('predicted_speedup', 1):.2f}  as run {model.get('as_run_speedup', 1):.2f}  "
                  f"retokenize {e['share_retokenize']:.3f}")
    mismatched = {f"{mode}/{arm}": f"{e['greedy_matches_target']}/{e['calls']}"
                  for mode, block in data["arms"].items() for arm, e in block.items()
                  if "greedy_matches_target" in e and e["greedy_matches_target"] != e["calls"]}
    print(f"wrote {out} ({data['meta']['seconds']} s)")
    if mismatched:
        raise SystemExit(f"greedy arms left the target's greedy tokens: {mismatched}")


if __name__ == "__main__":
    main()

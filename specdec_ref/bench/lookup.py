"""Prompt lookup on the tiny pair's target: prompts that invite copying against prose.

Greedy, 1 thread, interleaved calls: specdec_ref's `autoregressive_generate` (the
target alone), `decoder.speculative_generate` with `PromptLookupDrafter`, and transformers'
`generate` without and with `prompt_lookup_num_tokens`; all four must give the same
tokens. Then, without the copies' timing: where the accepted drafts were copied from
(prompt or the generated text), tokens per target pass against K, and a sampled
(temperature 1) control. Writes a JSON report.

Usage: python -m specdec_ref.bench.lookup [--out specdec_ref/data/prompt-lookup.json] [--repeats 3]
"""

from __future__ import annotations

import argparse
import ast
import copy
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel

from specdec_ref import SamplingConfig, autoregressive_generate, load_pair
from specdec_ref.decoder import speculative_generate
from specdec_ref.lookup import PromptLookupDrafter
from specdec_ref.training.corpus import CorpusConfig, held_out_prompts, iter_documents

from ..timing import cpu_name

GREEDY = SamplingConfig(temperature=0.0)
SAMPLED = SamplingConfig(temperature=1.0)
MAX_NEW_TOKENS = 96
NUM_DRAFT_TOKENS = 10
MAX_NGRAM_SIZE = 3
PROMPTS_PER_SET = 4


def copy_prompts(tokenizer, count: int) -> list[dict]:
    """Held-out standard-library functions (top level, 60 to 110 tokens), given whole and
    then begun again with their first two lines: "repeat" as they were, "edit" renamed."""
    prompts = []
    docs = sorted((d for d in iter_documents(side="held_out") if d.name.endswith(".py")), key=lambda d: d.name)
    for doc in docs:
        try:
            tree = ast.parse(doc.text)
        except SyntaxError:
            continue
        for node in tree.body:
            source = ast.get_source_segment(doc.text, node) if isinstance(node, ast.FunctionDef) else None
            if not source or not 60 <= len(tokenizer(source).input_ids) <= 110:
                continue
            start = "\n".join(source.split("\n")[:2])
            style = "repeat" if len(prompts) % 2 == 0 else "edit"
            if style == "edit":
                start = start.replace(f"def {node.name}(", f"def {node.name}_v2(", 1)
            text = f"{source}\n\n\n{start}"
            prompts.append({"set": "copy", "style": style, "source": f"{doc.name}:{node.name}",
                            "ids": torch.tensor([tokenizer(text).input_ids])})
            break
        if len(prompts) == count:
            break
    return prompts


def prose_prompts(tokenizer, count: int) -> list[dict]:
    """Held-out documentation topics (English prose), 128 tokens each."""
    # Few held-out topics are long enough: ask for 6 (two passes over them) and keep `count`.
    ids = held_out_prompts(tokenizer, num_prompts=6, prompt_tokens=128, seed=0,
                           config=CorpusConfig(include_source=False))[:count]
    return [{"set": "prose", "style": "prose", "source": f"held-out topic prompt {i}", "ids": x}
            for i, x in enumerate(ids)]


def copy_sources(drafter: PromptLookupDrafter, out, n: int) -> dict:
    """Accepted drafts by where the lookup copied them from: the prompt or generated text."""
    counts, length = {"prompt": 0, "generated": 0}, n
    for record in out.trace:
        if record.num_accepted:
            start = drafter.match(out.sequences[:, :length])
            counts["prompt" if start < n else "generated"] += record.num_accepted
        length += len(record.emitted)
    return counts


@dataclass
class LookupBench:
    """What `build` made: the target, the prompts, the drafter and the four methods."""

    target: PreTrainedModel  # the tiny pair's target, on one CPU thread
    tokenizer: object  # its tokenizer
    prompts: list[dict]  # copy prompts, then prose prompts
    drafter: PromptLookupDrafter  # n-grams of up to MAX_NGRAM_SIZE, K = NUM_DRAFT_TOKENS
    # name -> call(ids) -> (sequences, target passes, GenerationOutput or None)
    methods: dict[str, Callable]
    common: dict  # the keyword arguments of every specdec_ref call


def build() -> LookupBench:
    """Load the target, write the prompts, and wrap the four methods alike."""
    _, target, tokenizer = load_pair("tiny", device="cpu")
    prompts = copy_prompts(tokenizer, PROMPTS_PER_SET) + prose_prompts(tokenizer, PROMPTS_PER_SET)
    drafter = PromptLookupDrafter(MAX_NGRAM_SIZE, NUM_DRAFT_TOKENS)
    plain = copy.deepcopy(target.generation_config)
    plain.update(max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None, pad_token_id=0, **GREEDY.generate_kwargs())
    assisted = copy.deepcopy(plain)
    assisted.update(prompt_lookup_num_tokens=NUM_DRAFT_TOKENS, max_matching_ngram_size=MAX_NGRAM_SIZE)
    passes = [0]  # transformers' target passes, counted by a hook
    target.register_forward_pre_hook(lambda module, inputs: passes.__setitem__(0, passes[0] + 1))

    def ours(fn):
        def call(ids):
            out = fn(ids)
            return out.sequences, out.stats.target_calls, out
        return call

    def hf(config):
        def call(ids):
            before = passes[0]
            with torch.no_grad():
                out = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            return out, passes[0] - before, None
        return call

    common = {"max_new_tokens": MAX_NEW_TOKENS, "sampling": GREEDY, "eos_token_id": None}
    methods = {
        "target": ours(lambda ids: autoregressive_generate(target, ids, **common)),
        "lookup": ours(lambda ids: speculative_generate(target, drafter, ids, **common)),
        "transformers_target": hf(plain),
        "transformers_lookup": hf(assisted),
    }
    return LookupBench(target, tokenizer, prompts, drafter, methods, common)


def run_timed(bench: LookupBench, repeats: int) -> tuple[list[dict], float]:
    """Greedy, timed: every method on every prompt, `repeats` interleaved rounds.

    Returns:
        One row per prompt with each method's median time and exact counts, and
        the seconds the timed rounds took (after one untimed warm-up call each).
    """
    methods, drafter = bench.methods, bench.drafter
    for call in methods.values():  # warm-up: one untimed call of each
        call(bench.prompts[0]["ids"])
    started = time.perf_counter()
    rows = []
    for index, prompt in enumerate(bench.prompts):
        ids, n = prompt["ids"], prompt["ids"].size(1)
        times, result = {name: [] for name in methods}, {}
        for repeat in range(repeats):
            names = list(methods)
            shift = (index + repeat) % len(names)
            for name in names[shift:] + names[:shift]:  # a different order every round
                start = time.perf_counter()
                result[name] = methods[name](ids)
                times[name].append(time.perf_counter() - start)
        reference = result["target"][0]
        row = {"set": prompt["set"], "style": prompt["style"], "source": prompt["source"], "prompt_tokens": n,
               "methods": {}}
        for name, (sequences, target_passes, output) in result.items():
            new, seconds = sequences.size(1) - n, statistics.median(times[name])
            entry = {"new_tokens": new, "target_passes": target_passes, "median_s": round(seconds, 4),
                     "tokens_per_s": round(new / seconds, 1), "tokens_per_target_pass": round(new / target_passes, 3),
                     "greedy_equal_to_target": bool(torch.equal(sequences, reference))}
            if name == "lookup":
                stats = output.stats
                entry.update(drafted=stats.drafted_tokens, accepted=stats.accepted_tokens, judged=stats.judged_tokens,
                             iterations=stats.iterations,
                             iterations_without_drafts=sum(1 for r in output.trace if not r.drafted),
                             accepted_copied_from=copy_sources(drafter, output, n))
            row["methods"][name] = entry
        row["continuation"] = bench.tokenizer.decode(reference[0, n:n + 40])
        rows.append(row)
        print(prompt["set"], prompt["source"], n, {k: (v["tokens_per_s"], v["tokens_per_target_pass"],
              v["greedy_equal_to_target"]) for k, v in row["methods"].items()}, flush=True)
    return rows, time.perf_counter() - started


def k_sweep(bench: LookupBench, rows: list[dict]) -> list[dict]:
    """Tokens per target pass against K and the occurrence rule (greedy, untimed);
    K = 10, last occurrence is read from the timed rows."""
    sweep = []
    for k, occurrence in ((2, "last"), (4, "last"), (10, "last"), (16, "last"), (10, "first")):
        entry = {"num_draft_tokens": k, "occurrence": occurrence}
        for set_name in ("copy", "prose"):
            new = target_passes = 0
            for prompt in (p for p in bench.prompts if p["set"] == set_name):
                if (k, occurrence) == (10, "last"):
                    row = next(r for r in rows if r["source"] == prompt["source"])["methods"]["lookup"]
                    new, target_passes = new + row["new_tokens"], target_passes + row["target_passes"]
                    continue
                drafter_k = PromptLookupDrafter(MAX_NGRAM_SIZE, k, occurrence)
                out = speculative_generate(bench.target, drafter_k, prompt["ids"], **bench.common)
                new, target_passes = new + out.stats.new_tokens, target_passes + out.stats.target_calls
            entry[f"{set_name}_tokens_per_target_pass"] = round(new / target_passes, 3)
        sweep.append(entry)
    return sweep


def sampled_control(bench: LookupBench) -> dict:
    """Temperature 1, where the target's text loops less: one timed call each of the
    target alone and of prompt lookup, per set."""
    sampled = {}
    for set_name in ("copy", "prose"):
        totals = {"target": [0, 0, 0.0], "lookup": [0, 0, 0.0]}
        accepted = drafted = 0
        for prompt in (p for p in bench.prompts if p["set"] == set_name):
            for name in ("target", "lookup"):
                kwargs = {**bench.common, "sampling": SAMPLED, "generator": torch.Generator().manual_seed(0)}
                start = time.perf_counter()
                if name == "target":
                    out = autoregressive_generate(bench.target, prompt["ids"], **kwargs)
                else:
                    out = speculative_generate(bench.target, bench.drafter, prompt["ids"], **kwargs)
                    accepted, drafted = accepted + out.stats.accepted_tokens, drafted + out.stats.drafted_tokens
                seconds = time.perf_counter() - start
                totals[name][0] += out.stats.new_tokens
                totals[name][1] += out.stats.target_calls
                totals[name][2] += seconds
        sampled[set_name] = {name: {"tokens_per_s": round(t[0] / t[2], 1),
                                    "tokens_per_target_pass": round(t[0] / t[1], 3)} for name, t in totals.items()}
        sampled[set_name]["lookup"]["speedup_vs_target"] = round(
            sampled[set_name]["lookup"]["tokens_per_s"] / sampled[set_name]["target"]["tokens_per_s"], 3)
        sampled[set_name]["lookup"]["acceptance_rate"] = round(accepted / drafted, 3) if drafted else None
    return sampled


def greedy_summary(rows: list[dict], methods: list[str]) -> dict:
    """Per set (copy, prose): each method's tokens/s and tokens per target pass over
    its prompts, the speedups, and what the lookup accepted and where from."""

    def totals(subset: list[dict], name: str) -> dict:
        tokens = sum(r["methods"][name]["new_tokens"] for r in subset)
        seconds = sum(r["methods"][name]["median_s"] for r in subset)
        target_passes = sum(r["methods"][name]["target_passes"] for r in subset)
        return {"tokens_per_s": round(tokens / seconds, 1), "tokens_per_target_pass": round(tokens / target_passes, 3)}

    summary = {}
    for set_name in ("copy", "prose"):
        subset = [r for r in rows if r["set"] == set_name]
        block = {name: totals(subset, name) for name in methods}
        block["lookup"]["speedup_vs_target"] = round(
            block["lookup"]["tokens_per_s"] / block["target"]["tokens_per_s"], 3)
        block["transformers_lookup"]["speedup_vs_transformers_target"] = round(
            block["transformers_lookup"]["tokens_per_s"] / block["transformers_target"]["tokens_per_s"], 3)
        counts = {key: sum(r["methods"]["lookup"][key] for r in subset) for key in ("drafted", "accepted", "judged")}
        block["lookup"].update(
            acceptance_rate=round(counts["accepted"] / counts["drafted"], 3),
            per_token_acceptance=round(counts["accepted"] / counts["judged"], 3),
            accepted_copied_from_prompt=sum(r["methods"]["lookup"]["accepted_copied_from"]["prompt"] for r in subset),
            accepted_copied_from_generated=sum(r["methods"]["lookup"]["accepted_copied_from"]["generated"]
                                               for r in subset))
        summary[set_name] = block
    return summary


def lookup_report(bench: LookupBench, rows: list[dict], timed_s: float, sweep: list[dict],
                  sampled: dict, repeats: int) -> dict:
    """The JSON report: what ran and how, then the measurements."""
    return {
        "meta": {
            "what": "prompt lookup (specdec_ref.lookup) vs the target alone vs transformers' prompt lookup",
            "script": f"python -m specdec_ref.bench.lookup --repeats {repeats}",
            "pair": "tiny, target only (12.6M parameters, Llama-style, 4096-token BPE, 512 positions)",
            "device": "cpu", "machine": cpu_name(), "dtype": str(bench.target.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "niceness": os.nice(0),
            "note": "2-core machine shared with other jobs: timings are noisy (medians of interleaved calls); "
                    "tokens per target pass are exact counts",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now().astimezone().isoformat(),
            "max_new_tokens": MAX_NEW_TOKENS, "repeats": repeats, "eos": "off (every call emits max_new_tokens)",
            "drafter": {"max_ngram_size": MAX_NGRAM_SIZE, "num_draft_tokens": NUM_DRAFT_TOKENS, "occurrence": "last"},
            "transformers_generate": {"prompt_lookup_num_tokens": NUM_DRAFT_TOKENS,
                                      "max_matching_ngram_size": MAX_NGRAM_SIZE, "do_sample": False},
            "prompts": {"copy": f"{PROMPTS_PER_SET} held-out stdlib top-level functions of 60-110 tokens, given whole, "
                                "then begun again with their first two lines (repeat; edit = renamed)",
                        "prose": f"the first {PROMPTS_PER_SET} of held_out_prompts(num_prompts=6, prompt_tokens=128, "
                                 "seed=0, config=CorpusConfig(include_source=False)): held-out documentation prose"},
            "tokens_per_s": "new tokens / sum over prompts of the median seconds of one call",
            "target_passes": "forward passes of the target (transformers: counted by a forward pre-hook)",
            "accepted_copied_from": "accepted drafts whose lookup match starts in the prompt / in generated text",
            "timed_seconds": round(timed_s, 1),
        },
        "all_greedy_equal": all(m["greedy_equal_to_target"] for r in rows for m in r["methods"].values()),
        "greedy": greedy_summary(rows, list(bench.methods)),
        "k_sweep_greedy": sweep,
        "sampled_t1": sampled,
        "per_prompt": rows,
    }


def main() -> None:
    """Build, run (timed, then the K sweep and the sampled control), report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    bench = build()
    rows, timed_s = run_timed(bench, args.repeats)
    report = lookup_report(bench, rows, timed_s, k_sweep(bench, rows), sampled_control(bench), args.repeats)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({key: report[key] for key in ("all_greedy_equal", "greedy", "k_sweep_greedy", "sampled_t1")},
                     indent=1))


if __name__ == "__main__":
    main()

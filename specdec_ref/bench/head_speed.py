"""Draft heads timed: speed over the fastest `generate`, side by side with the separate draft.

`python -m specdec_ref.bench.head_speed` runs, on the tiny pair's held-out prompts
(`training.corpus.held_out_prompts`, 32 tokens each), greedy and at T = 0.7, the arms of
`bench.head_trees` (the separate draft, Medusa's heads and EAGLE's head; chains of K = 4
and trees, sampled children at T = 0.7) beside the target's own `generate` (sdpa and
eager attention; the faster is "the fastest generate"). `--path as-loaded` runs everything
in float32 as loaded; `--path fast` puts the pair on chapter 12's fast CPU path first
(`fast.prepare`: bfloat16 where the CPU computes it, prepacked linear layers, the target's
grouped eager attention, the lean draft) and the heads in that dtype, prepacked: the
feature hook reads the prepared target's final norm as it reads the plain one. Its
baselines are then `generate` on float32 as loaded (sdpa), on a prepacked bfloat16 copy
(sdpa) and on the prepared target (grouped eager): the fastest of the three is "the
fastest generate".

Protocol: one untimed warm-up of every arm, then `rounds` rounds of all arms in a
round-robin order moved by one arm per round, each arm generating every prompt; per round
tokens/s by wall clock and by process CPU time, each speedup against the same round's
baseline. Greedy arms must emit `generate`'s tokens (counted, "k/n").

Beside it, chapter 6's prediction S = E / (D + v): E the arm's measured tokens per
target pass, D its draft cost per round in target steps (K c for a chain; for a tree
one draft pass per level, each priced at its rows; one pass for Medusa's heads), v the
target's pass over the N + 1 verified rows against a one-token step (`bench.head_costs`).
It writes `specdec_ref/data/head-speed-tiny-cpu.json`.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from ..decoder import GenerationStats, speculative_generate
from ..fast.lean_eagle import LeanEagle
from ..fast.packed import pack_linear_layers
from ..fast.prepared import cast, prepare
from ..heads.drafters import EagleDrafter, MedusaDrafter
from ..heads.eagle import EagleHead
from ..heads.features import FeatureSource
from ..heads.medusa import MedusaHeads
from ..heads.trees import EagleTreeSource, FeatureTreeForward, MedusaTreeSource
from ..models import TINY_DIR, load_pair
from ..sampling import SamplingConfig
from ..timing import cpu_flags, cpu_name
from ..trees.tree import tree_speculative_generate
from .costs import spread
from .head_costs import pass_costs, predicted_speedup
from .head_trees import PROMPTS

OUT = Path(__file__).resolve().parent.parent / "data" / "head-speed-tiny-cpu.json"
MODES = {"greedy": SamplingConfig(temperature=0.0), "T=0.7": SamplingConfig(temperature=0.7)}
CHAIN = (1, 1, 1, 1)  # K = 4 drafts in a row
# Arm id -> (drafter, widths; for `generate` the attention instead).
ARMS = {"generate sdpa": ("generate", "sdpa"), "generate eager": ("generate", "eager"),
        "draft chain K=4": ("draft", CHAIN), "draft tree (2,2,1,1)": ("draft", (2, 2, 1, 1)),
        "EAGLE chain K=4": ("eagle", CHAIN), "EAGLE lean chain K=4": ("eagle-lean", CHAIN),
        "EAGLE tree (2,2,1,1)": ("eagle", (2, 2, 1, 1)),
        "EAGLE tree (4,2,2,1)": ("eagle", (4, 2, 2, 1)),
        "Medusa chain K=4": ("medusa", CHAIN), "Medusa tree (2,2,1,1)": ("medusa", (2, 2, 1, 1)),
        "generate float32": ("generate", "sdpa")}  # the fast path's third baseline


@dataclass
class Models:
    """The tiny pair and the heads shipped for its target."""

    target: torch.nn.Module  # the target, float32 as loaded (or prepared: `path`)
    draft: torch.nn.Module  # the separate draft model (or its lean source)
    eagle: EagleHead  # EAGLE's head (pairs/tiny/eagle-head)
    medusa: MedusaHeads  # Medusa's heads (pairs/tiny/medusa-heads)
    lean_eagle: LeanEagle  # EAGLE's head run lean (`fast.lean_eagle`), chains only
    path: str = "as-loaded"  # or "fast": the target's attention is fixed, not switched
    baselines: dict | None = None  # fast path: generate arm -> the model it runs


def load_models(path: str) -> tuple[Models, object]:
    """The pair and the heads on `path` ("as-loaded" or "fast"), and the tokenizer."""
    if path not in ("as-loaded", "fast"):
        raise ValueError(f"path must be 'as-loaded' or 'fast', got {path!r}")
    draft, target, tokenizer = load_pair("tiny", device="cpu")
    baselines = None
    if path == "fast":
        plain = copy.deepcopy(target)  # float32 as loaded, sdpa
        packed = copy.deepcopy(target)  # the prepared dtype and layers, sdpa
        fast = prepare(draft, target)  # in place: dtype, packing, grouped attention
        cast(packed, target.dtype)
        pack_linear_layers(packed)
        baselines = {"generate sdpa": packed, "generate eager": target,
                     "generate float32": plain}
        draft = fast.draft
    eagle = EagleHead.load(TINY_DIR / "eagle-head", target)
    medusa = MedusaHeads.load(TINY_DIR / "medusa-heads", target)
    if path == "fast":
        pack_linear_layers(eagle)
        pack_linear_layers(medusa)
    return Models(target, draft, eagle, medusa, LeanEagle(eagle), path, baselines), tokenizer


def generate(models: Models, arm: str, prompt: torch.Tensor, sampling: SamplingConfig,
             new_tokens: int, seed: int) -> tuple[torch.Tensor, GenerationStats | None]:
    """One generation of `arm` on `prompt` (1, n): the sequence and the decoder's stats."""
    kind, shape = ARMS[arm]
    target = models.target
    if models.baselines is not None:  # the fast path: each generate arm has its model
        if kind == "generate":
            target = models.baselines[arm]
    else:
        # The heads' path and the separate draft run on the target's attention as loaded (sdpa).
        attention = shape if kind == "generate" else "sdpa"
        if target.config._attn_implementation != attention:
            target.set_attn_implementation(attention)
    if kind == "generate":
        torch.manual_seed(seed)
        with torch.no_grad():
            out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                  eos_token_id=None, pad_token_id=0, **sampling.generate_kwargs())
        return out, None
    common = {"max_new_tokens": new_tokens, "sampling": sampling, "generator": torch.Generator().manual_seed(seed)}
    chain = shape == CHAIN
    # A head drafts from the target's features: a source over the target, hooked for this run.
    verifier = (models.target if kind == "draft"
                else FeatureSource(target) if chain else FeatureTreeForward(target))
    try:
        if kind == "draft":
            draft = models.draft
        elif kind == "eagle-lean":
            draft = EagleDrafter(models.lean_eagle, verifier, 4)
        elif kind == "eagle":
            draft = EagleDrafter(models.eagle, verifier, 4) if chain else EagleTreeSource(models.eagle, verifier)
        else:
            draft = MedusaDrafter(models.medusa, verifier, 4) if chain else MedusaTreeSource(models.medusa, verifier)
        if chain:
            out = speculative_generate(verifier, draft, prompt, num_draft_tokens=4, eos_token_id=None, **common)
        else:
            out = tree_speculative_generate(verifier, draft, prompt, widths=shape, **common)
    finally:
        if verifier is not target:
            verifier.close()
    return out.sequences, out.stats


def run(num_prompts: int = 8, new_tokens: int = 64, rounds: int = 3, arms: list[str] | None = None,
        cost_repeats: int = 20, path: str = "as-loaded", domain: str = "held-out") -> dict:
    """Time every arm in both modes and return the report (the JSON written)."""
    arms = list(arms or [a for a in ARMS if path == "fast" or a != "generate float32"])
    if domain not in PROMPTS:
        raise ValueError(f"domain must be one of {sorted(PROMPTS)}, got {domain!r}")
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not any(ARMS[a][0] == "generate" for a in arms):
        raise ValueError(f"arms must be names of ARMS ({list(ARMS)}) including a generate arm, got {arms}")
    if path == "as-loaded" and "generate float32" in arms:
        raise ValueError("the arm 'generate float32' is the fast path's baseline: pass path='fast'")
    models, tokenizer = load_models(path)
    prompts = PROMPTS[domain](tokenizer, num_prompts=num_prompts, prompt_tokens=32, seed=0)
    # The reference for greedy outputs; it doubles as generate's warm-up.
    # (on the fast path the prepared target's own generate: its kernels define its greedy tokens)
    reference = "generate eager" if path == "fast" else "generate sdpa"
    expected = [generate(models, reference, p, MODES["greedy"], new_tokens, 0)[0] for p in prompts]
    for arm, sampling in ((a, s) for s in MODES.values() for a in arms):  # warm-up: every arm once
        generate(models, arm, prompts[0], sampling, new_tokens, 0)
    rates = {(arm, mode, clock): [] for arm in arms for mode in MODES for clock in ("wall", "cpu")}
    stats = {(arm, mode): GenerationStats() for arm in arms for mode in MODES}
    matched = {arm: 0 for arm in arms}
    for r in range(rounds):
        order = arms[r % len(arms):] + arms[: r % len(arms)]  # round robin, moved one arm per round
        for mode, sampling in MODES.items():
            for arm in order:
                wall = cpu = 0.0
                for i, prompt in enumerate(prompts):
                    start_wall, start_cpu = time.perf_counter(), time.process_time()
                    sequences, run_stats = generate(models, arm, prompt, sampling, new_tokens, 1000 * r + i)
                    wall += time.perf_counter() - start_wall
                    cpu += time.process_time() - start_cpu
                    if run_stats is not None:
                        stats[arm, mode] += run_stats
                    if sampling.greedy:
                        matched[arm] += torch.equal(sequences, expected[i])
                rates[arm, mode, "wall"].append(len(prompts) * new_tokens / wall)
                rates[arm, mode, "cpu"].append(len(prompts) * new_tokens / cpu)
                print(f"round {r} {mode} {arm}: {rates[arm, mode, 'wall'][-1]:.1f} tok/s", flush=True)
    costs = pass_costs(models, prompts[0], cost_repeats)
    report = {"meta": {**meta(num_prompts, new_tokens, rounds, path, models.target.dtype), "domain": domain},
              "pass_costs_cpu_ms": costs, "modes": {}}
    for mode in MODES:
        # The fastest generate, per clock: the generate arm with the highest median tokens/s.
        base = {clock: max((a for a in arms if ARMS[a][0] == "generate"),
                           key=lambda a, c=clock: statistics.median(rates[a, mode, c])) for clock in ("wall", "cpu")}
        rows = {}
        for arm in arms:
            total = stats[arm, mode]
            tokens = total.tokens_per_target_call if total.target_calls else 1.0
            row = {"drafter": ARMS[arm][0], "tokens_per_target_call": round(tokens, 3)}
            for clock in ("wall", "cpu"):
                row[f"tokens_per_s_{clock}"] = spread(rates[arm, mode, clock], 3)
                pairs = zip(rates[arm, mode, clock], rates[base[clock], mode, clock], strict=True)
                row[f"speedup_{clock}"] = spread([a / b for a, b in pairs], 3)  # per round, that round's baseline
            model = predicted_speedup(ARMS[arm], tokens, costs)
            row["predicted_speedup"], row["model_D_v"] = model["S"], [model["D"], model["v"]]
            if mode == "greedy":
                row["matches_generate"] = f"{matched[arm]}/{rounds * len(prompts)}"
            rows[arm] = row
        report["modes"][mode] = {"fastest_generate": base,
                                 "fastest_generate_tokens_per_s": {c: rows[base[c]][f"tokens_per_s_{c}"]["median"]
                                                                   for c in base}, "arms": rows}
    report["model_note"] = model_note(report)
    return report


def meta(num_prompts: int, new_tokens: int, rounds: int, path: str, dtype: torch.dtype) -> dict:
    """What the numbers were measured on."""
    return {"prompts": num_prompts, "prompt_tokens": 32, "new_tokens": new_tokens, "rounds": rounds,
            "path": path, "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "transformers": transformers.__version__, "date": datetime.date.today().isoformat(),
            "cpu_model": cpu_name(), "cpu_flags": cpu_flags(),
            "clocks": "wall: time.perf_counter; cpu: time.process_time (all threads of the process)",
            "note": "wall figures carry whatever else the machine ran, hence the spread over rounds; "
                    "the order of arms moves every round"}


def model_note(report: dict) -> str:
    """Where S = E / (D + v) misses the measured CPU-time speedup, in words."""
    misses = [(row["predicted_speedup"] / row["speedup_cpu"]["median"], arm, mode)
              for mode, block in report["modes"].items() for arm, row in block["arms"].items()
              if row["drafter"] != "generate"]
    worst = max(misses)
    over = sum(ratio > 1.1 for ratio, _, _ in misses)
    return (f"predicted over measured (CPU time) ranges {min(misses)[0]:.2f}..{worst[0]:.2f}; the model "
            f"overestimates {over} of {len(misses)} arm-modes by more than 10% (worst: {worst[1]}, {worst[2]}). "
            "It prices only forward passes: not the decoder's Python per round (sampling, the rejection "
            "rule, tree building and masks, cache crops), not generate's own per-token overhead, and it "
            "prices tree passes as causal passes over the same rows and ignores the rows a draft re-reads.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=None, help="a subset of the arms")
    parser.add_argument("--cost-repeats", type=int, default=20)
    parser.add_argument("--domain", choices=sorted(PROMPTS), default="held-out",
                        help="held-out prompts, or prompts from outside the training domain")
    parser.add_argument("--path", choices=("as-loaded", "fast"), default="as-loaded",
                        help="float32 as loaded, or chapter 12's fast CPU path")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: data/head-speed[-fast][-outside]-tiny-cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = run(args.prompts, args.max_new_tokens, args.rounds, args.arms, args.cost_repeats, args.path,
                 args.domain)
    # head-speed[-fast][-outside]-tiny-cpu.json
    name = "head-speed" + ("-fast" if args.path == "fast" else "") + ("-outside" if args.domain == "outside" else "")
    out = args.out or OUT.with_name(f"{name}-tiny-cpu.json")
    out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

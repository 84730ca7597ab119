"""Measure the trained draft heads against the tiny pair's separate draft; write their cards.

`python -m specdec_ref.training.heads_card --threads 1` (after `training.heads`) measures,
on the held-out prompts of the tiny pair's card (`corpus.held_out_prompts`: 32 prompts of
32 tokens, 64 new tokens, K = 4), with the package's own `speculative_generate`:

* the shipped separate draft (`load_pair("tiny")`), as the tiny pair's card does;
* each trained head in `pairs/tiny` (`eagle-head`, `medusa-heads`), drafting through
  `heads.drafters` for the same target, read through a `heads.FeatureSource`;

greedy and at temperature 1: alpha (accepted / judged drafts), accepted / drafted,
tokens per target pass, and whether greedy output is the target's own. It writes
`metrics.json` (these figures, with `training.json`'s facts of the run) and `README.md`
into each head's folder. Invariant: the card quotes `metrics.json` and nothing else.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Callable
from pathlib import Path

import torch

from ..decoder import GenerationStats, autoregressive_generate, speculative_generate
from ..heads.drafters import EagleDrafter, MedusaDrafter
from ..heads.eagle import EagleHead
from ..heads.features import FeatureSource
from ..heads.medusa import MedusaHeads
from ..models import load_pair
from ..sampling import SamplingConfig
from .config import DEFAULT_OUT
from .corpus import held_out_prompts

FOLDERS = {"eagle": DEFAULT_OUT / "eagle-head", "medusa": DEFAULT_OUT / "medusa-heads"}
SAMPLINGS = {"greedy": SamplingConfig(temperature=0.0), "temperature_1": SamplingConfig(temperature=1.0)}


def arm_figures(run: Callable, prompts: list[torch.Tensor], baselines: list[torch.Tensor] | None) -> dict:
    """Totals of one arm over the prompts: alpha, accepted / drafted, tokens per target pass."""
    total, matches = GenerationStats(), 0
    for prompt, baseline in zip(prompts, baselines or [None] * len(prompts), strict=True):
        out = run(prompt)
        total += out.stats
        matches += baseline is not None and torch.equal(out.sequences, baseline)
    row = {"alpha": round(total.per_token_acceptance, 4), "accepted_per_drafted": round(total.acceptance_rate, 4),
           "tokens_per_target_call": round(total.tokens_per_target_call, 3),
           "target_calls": total.target_calls, "new_tokens": total.new_tokens}
    if baselines is not None:
        row["matches_target_greedy"] = f"{matches}/{len(prompts)}"
    return row


def measure(kinds: list[str], num_prompts: int = 32, new_tokens: int = 64, k: int = 4, seed: int = 0) -> dict:
    """Every arm's figures, on the held-out prompts of the tiny pair's card."""
    draft, target, tokenizer = load_pair("tiny", device="cpu")
    prompts = held_out_prompts(tokenizer, num_prompts=num_prompts, prompt_tokens=32)
    eos = tokenizer.eos_token_id
    source = FeatureSource(target)
    heads = {"eagle": lambda: EagleDrafter(EagleHead.load(FOLDERS["eagle"], target), source, k),
             "medusa": lambda: MedusaDrafter(MedusaHeads.load(FOLDERS["medusa"], target), source, k)}
    drafters = {"draft": draft, **{kind: heads[kind]() for kind in kinds}}
    results: dict = {}
    for label, sampling in SAMPLINGS.items():
        baselines = [autoregressive_generate(target, p, max_new_tokens=new_tokens, sampling=sampling,
                                             eos_token_id=eos).sequences for p in prompts] if sampling.greedy else None
        for arm, drafter in drafters.items():
            generator = torch.Generator().manual_seed(seed)
            verifier = target if arm == "draft" else source

            def run(prompt, drafter=drafter, verifier=verifier, sampling=sampling, generator=generator):
                return speculative_generate(verifier, drafter, prompt, max_new_tokens=new_tokens,
                                            num_draft_tokens=k, sampling=sampling, generator=generator,
                                            eos_token_id=eos)

            results.setdefault(label, {})[arm] = arm_figures(run, prompts, baselines)
    return {"num_prompts": num_prompts, "prompt_tokens": 32, "new_tokens": new_tokens, "k": k, "seed": seed,
            "acceptance": results}


def curve(folder: Path) -> list[dict]:
    """The training log's rows that carry a held-out top-1 (the checkpoints)."""
    with open(folder / "training_log.csv") as handle:
        return [{"step": int(r["step"]), "loss": float(r["loss"]), "top1": float(r["top1"]),
                 "held_out_top1": float(r["held_out_top1"]), "seconds": float(r["seconds"])}
                for r in csv.DictReader(handle) if r["held_out_top1"]]


def write_card(folder: Path, kind: str, metrics: dict) -> None:
    """README.md for one head, from its metrics.json."""
    run, m = metrics["training"], metrics["measured"]
    config = run["config"]
    title = "EAGLE head" if kind == "eagle" else "Medusa heads"
    lines = [f"# The tiny target's {title}", "",
             f"Trained by `python -m specdec_ref.training.heads --kind {kind}`, measured by "
             "`python -m specdec_ref.training.heads_card`, which wrote this card from `metrics.json`.", "",
             "## Training", "",
             f"- Data: {run['feature_tokens']:,} tokens ({config['windows']} windows of {config['context']}) of the "
             "tiny pair's training corpus, read once by the frozen target (bfloat16); the input of its final "
             f"norm kept in float16 ({run['feature_seconds'] / 60:.1f} min with tokenizing).",
             f"- Steps: {run['steps_done']} of {config['steps']} planned, batches of {config['batch_size']} x "
             f"{config['context']}: {run['tokens_seen']:,} tokens seen; peak learning rate {config['lr']}, "
             f"AdamW (0.9, 0.95), clip {config['clip']}.",
             f"- Wall time: {run['train_seconds'] / 60:.1f} min of training on {run['torch_threads']} CPU "
             f"thread(s) (torch {run['torch']}), plus the features.",
             f"- Parameters: {run['params']:,} (the embedding, final norm and LM head are the target's).", ""]
    points = metrics["curve"]
    if points:
        lines += ["| step | training loss | top-1 agreement (train) | top-1 agreement (held out) |",
                  "|---|---|---|---|"]
        shown = points if len(points) <= 8 else points[:: max(1, len(points) // 7)] + points[-1:]
        seen = set()
        for p in shown:
            if p["step"] not in seen:
                seen.add(p["step"])
                lines.append(f"| {p['step']} | {p['loss']:.3f} | {p['top1']:.3f} | {p['held_out_top1']:.3f} |")
        lines += ["", "Top-1 agreement: the head's argmax equals the target's at the next position "
                  "(teacher-forced, the first draft's chance in greedy decoding).", ""]
    lines += ["## Held-out acceptance", "",
              f"`speculative_generate` with K = {m['k']} on {m['num_prompts']} held-out prompts of "
              f"{m['prompt_tokens']} tokens, {m['new_tokens']} new tokens each (the prompts of the tiny pair's "
              "card); the separate draft is the shipped `pairs/tiny/draft`. alpha is accepted / judged drafts. "
              "A head drafts nothing in the first round (the target has read nothing yet), which counts in "
              "its tokens per target pass.", "",
              "| sampling | drafter | alpha | accepted / drafted | tokens per target pass | greedy = target's |",
              "|---|---|---|---|---|---|"]
    for label, arms in m["acceptance"].items():
        for arm, row in arms.items():
            lines.append(f"| {label.replace('_', ' ')} | {arm} | {row['alpha']:.3f} | "
                         f"{row['accepted_per_drafted']:.3f} | {row['tokens_per_target_call']:.2f} | "
                         f"{row.get('matches_target_greedy', '-')} |")
    lines += ["", "Speed is not measured here: a head's pass costs more than the one-layer draft's "
              "(its LM head spans the target's 4096 tokens)."]
    (folder / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    """Command line: measure every trained head and the separate draft, write the cards."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--prompts", type=int, default=32)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    kinds = [kind for kind, folder in FOLDERS.items() if (folder / "training.json").is_file()]
    measured = measure(kinds, num_prompts=args.prompts)
    for kind in kinds:
        folder = FOLDERS[kind]
        metrics = {"training": json.loads((folder / "training.json").read_text()), "curve": curve(folder),
                   "measured": measured}
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        write_card(folder, kind, metrics)
    print(json.dumps(measured["acceptance"], indent=2))
    return measured


if __name__ == "__main__":
    main()

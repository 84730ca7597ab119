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
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..decoder import GenerationStats, autoregressive_generate, speculative_generate
from ..heads.drafters import EagleDrafter, MedusaDrafter
from ..heads.eagle import EagleHead
from ..heads.features import FeatureSource
from ..heads.medusa import MedusaHeads
from ..kv_cache import CachedForward
from ..models import load_pair
from ..sampling import SamplingConfig
from ..timing import cpu_name
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


def thread_ms(step: Callable[[], object], repeats: int = 30, warmup: int = 3) -> float:
    """Median CPU milliseconds of the calling thread per call of `step`.

    With one torch thread the pass runs in the calling thread, so its CPU time is its
    cost, and unlike wall time it does not grow when other processes share the cores.
    """
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(repeats):
        start = time.thread_time()
        step()
        samples.append(time.thread_time() - start)
    return statistics.median(samples) * 1e3


def one_token_steps(draft, target, modules: dict, prefix: torch.Tensor) -> dict[str, Callable[[], object]]:
    """A one-token step after `prefix` (1, n) per arm, each undone before the next call:
    the target's and the draft's cached passes; EAGLE's cached head pass with the target's
    norm and LM head; Medusa's round of every head from one feature."""
    n = prefix.size(1)
    sequence = torch.cat([prefix, prefix[:, :1]], dim=1)  # (1, n + 1)
    steps: dict[str, Callable[[], object]] = {}
    for name, model in (("target", target), ("draft", draft)):
        source = CachedForward(model)
        source.last_logits(prefix, 1)
        steps[name] = lambda source=source: (source.rollback(n), source.last_logits(sequence, 1))
    features_source = FeatureSource(target)
    features_source.last_logits(prefix, 1)
    features_source.close()
    features, parts = features_source.features, features_source.parts  # (n, H)
    if "eagle" in modules:
        head, cache = modules["eagle"], modules["eagle"].new_cache()
        head(parts.embed(prefix[:, 1:]), features[None, :-1], torch.arange(n - 1)[None], cache)
        token, feature, position = prefix[:, -1:], features[None, -1:], torch.tensor([[n - 1]])

        def eagle_step() -> torch.Tensor:
            excess = cache.get_seq_length() - (n - 1)  # the previous step's entry
            if excess > 0:
                cache.crop(-excess)
            return parts.logits(head(parts.embed(token), feature, position, cache))

        steps["eagle"] = eagle_step
    if "medusa" in modules:
        heads = modules["medusa"]
        steps["medusa"] = lambda: [heads.logits(features[-1:], parts, k) for k in range(len(heads))]
    return steps


@torch.no_grad()
def latencies(draft, target, modules: dict, prefix: torch.Tensor, rounds: int = 5) -> dict:
    """Median CPU ms per drafted token of each arm, interleaved rounds; c against the target."""
    steps = one_token_steps(draft, target, modules, prefix)
    rows: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            rows[name].append(thread_ms(step))
    ms = {name: statistics.median(values) for name, values in rows.items()}
    if "medusa" in ms:
        ms["medusa"] /= len(modules["medusa"])  # one round drafts K tokens
    out = {f"{name}_1_token": round(value, 4) for name, value in ms.items()}
    out.update({f"c_{name}": round(ms[name] / ms["target"], 3) for name in ms if name != "target"})
    return out


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
    # Cost per drafted token beside the target's one-token pass (batch 1, KV cache, a
    # 128-token held-out prefix, CPU time of one thread).
    prefix = torch.cat(prompts)[:4].reshape(1, -1)  # (1, 128)
    modules = {kind: drafters[kind].head if kind == "eagle" else drafters[kind].heads for kind in kinds}
    latency = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "prefix_tokens": prefix.size(1),
               **latencies(draft, target, modules, prefix)}
    return {"num_prompts": num_prompts, "prompt_tokens": 32, "new_tokens": new_tokens, "k": k, "seed": seed,
            "acceptance": results, "latency_ms": latency}


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
    command = f"python -m specdec_ref.training.heads --kind {kind} --threads 1 --steps {config['steps']}"
    cut = run["steps_done"] < config["steps"]
    if cut:
        command += f" --stop-at {run['steps_done']}"
    lines = [f"# The tiny target's {title}", "",
             f"Trained by `{command}`, measured by `python -m specdec_ref.training.heads_card --threads 1`, "
             "which wrote this card from `metrics.json`"
             + (f" (the run stopped at its time budget, `--max-minutes {config['max_minutes']}`, at step "
                f"{run['steps_done']} of the {config['steps']} its learning-rate schedule spans; `--stop-at` "
                "repeats that)." if cut else "."), "",
             "## Training", "",
             f"- Data: {run['feature_tokens']:,} tokens ({config['windows']} windows of {config['context']}) of the "
             "tiny pair's training corpus, read once by the frozen target (bfloat16); the input of its final "
             f"norm kept in float16 ({run['feature_seconds'] / 60:.1f} min on 1 thread, with tokenizing; "
             "the file is computed once and shared by both kinds of head).",
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
                  "(teacher-forced, the first draft's chance in greedy decoding)"
                  + ("; for Medusa, head 1's." if kind == "medusa" else "."), ""]
    held = run.get("held_out") or {}
    if kind == "medusa" and "top1_head1" in held:
        per_head = ", ".join(f"{held[f'top1_head{k}']:.3f}" for k in range(1, config["medusa_heads"] + 1))
        lines += [f"Held-out top-1 agreement of heads 1 to {config['medusa_heads']} at the end: {per_head} "
                  "(each guesses one token further ahead, blind to the drafts before its own).", ""]
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
    lat = m["latency_ms"]
    lines += ["", f"Cost per drafted token (batch 1, KV cache, a {lat['prefix_tokens']}-token prefix, "
              f"{lat['threads']} thread, {lat['cpu']}; median CPU time of the thread, which a shared machine does not "
              "inflate as it does wall time), against the target's "
              f"one-token pass of {lat['target_1_token']:.2f} ms: the separate draft {lat['draft_1_token']:.2f} ms "
              f"(c = {lat['c_draft']:.3f})"
              + "".join(f", the {arm} head {lat[f'{arm}_1_token']:.2f} ms (c = {lat[f'c_{arm}']:.3f})"
                        for arm in ("eagle", "medusa") if f"c_{arm}" in lat)
              + ". Medusa's cost is one round of all its heads over K. End-to-end speed is not measured here."]
    (folder / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    """Command line: measure every trained head and the separate draft, write the cards."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--cards-only", action="store_true",
                        help="measure nothing: rewrite each card from its metrics.json and training.json")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    kinds = [kind for kind, folder in FOLDERS.items() if (folder / "training.json").is_file()]
    if args.cards_only:
        measured = json.loads((FOLDERS[kinds[0]] / "metrics.json").read_text())["measured"]
    else:
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

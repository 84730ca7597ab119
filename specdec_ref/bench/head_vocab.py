"""What a reduced draft vocabulary buys EAGLE's head: acceptance against cost, measured.

`python -m specdec_ref.bench.head_vocab` drafts with the shipped EAGLE head for the tiny
target over the first N tokens of its draft vocabulary (`heads.draft_vocab`, most
frequent first; N = 4096 is the whole vocabulary) and measures, per N:

* on the tiny pair's 32 held-out prompts (64 new tokens, K = 4), greedy and at T = 0.7:
  alpha (accepted / judged drafts), tokens per target pass, and for greedy whether the
  output is the target's own on every prompt;
* the head's cost per drafted token against a target step, c, as CPU time of the
  calling thread (one torch thread: the pass runs there, so other processes on the
  machine do not inflate it), median of interleaved rounds with their range; and the
  target's v(K), a pass over K + 1 tokens against one, the same way;
* chapter 6's prediction S = E / (K c + v(K)) from those figures (E the measured tokens
  per target pass), for K = 4.

It writes `specdec_ref/data/head-vocab-tiny-cpu.json`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from ..decoder import GenerationStats, speculative_generate
from ..heads.draft_vocab import ReducedParts, load_draft_vocab
from ..heads.drafters import EagleDrafter
from ..heads.eagle import EagleHead
from ..heads.features import FeatureSource
from ..kv_cache import CachedForward
from ..models import TINY_DIR, load_pair
from ..sampling import SamplingConfig
from ..timing import cpu_name
from ..training.corpus import held_out_prompts
from ..training.heads_card import thread_ms

OUT = Path(__file__).resolve().parent.parent / "data" / "head-vocab-tiny-cpu.json"
SIZES = (512, 1024, 2048, 4096)
SAMPLINGS = {"greedy": SamplingConfig(temperature=0.0), "T=0.7": SamplingConfig(temperature=0.7)}


@torch.no_grad()
def step_costs(target, head: EagleHead, parts_by_size: dict, prefix: torch.Tensor, k: int,
               rounds: int) -> dict:
    """CPU ms per call, median of `rounds` interleaved rounds and their range: the target's
    one-token and (K + 1)-token steps, and the head's step over each draft vocabulary."""
    n = prefix.size(1)
    source = CachedForward(target)
    source.last_logits(prefix, 1)
    one, wide = torch.cat([prefix, prefix[:, :1]], 1), torch.cat([prefix, prefix[:, : k + 1]], 1)
    steps = {"target_1": lambda: (source.rollback(n), source.last_logits(one, 1)),
             f"target_{k + 1}": lambda: (source.rollback(n), source.last_logits(wide, k + 1))}
    features_source = FeatureSource(target)
    features_source.last_logits(prefix, 1)
    features_source.close()
    features, full = features_source.features, features_source.parts  # (n, H)
    cache = head.new_cache()
    head(full.embed(prefix[:, 1:]), features[None, :-1], torch.arange(n - 1)[None], cache)
    token, feature, position = prefix[:, -1:], features[None, -1:], torch.tensor([[n - 1]])
    for size, parts in parts_by_size.items():
        def head_step(parts=parts) -> torch.Tensor:
            excess = cache.get_seq_length() - (n - 1)
            if excess > 0:
                cache.crop(-excess)
            return parts.logits(head(parts.embed(token), feature, position, cache))

        steps[f"head_{size}"] = head_step
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            samples[name].append(thread_ms(step))
    return {name: {"median_ms": round(statistics.median(v), 4), "min_ms": round(min(v), 4),
                   "max_ms": round(max(v), 4)} for name, v in samples.items()}


def run(num_prompts: int = 32, new_tokens: int = 64, k: int = 4, rounds: int = 7) -> dict:
    _, target, tokenizer = load_pair("tiny", device="cpu")
    head = EagleHead.load(TINY_DIR / "eagle-head", target)
    source = FeatureSource(target)
    parts_by_size = {size: ReducedParts(source.parts, load_draft_vocab(TINY_DIR / "eagle-head", size))
                     for size in SIZES}
    prompts = held_out_prompts(tokenizer, num_prompts=num_prompts, prompt_tokens=32, seed=0)
    greedy = [target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=new_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0) for p in prompts]
    costs = step_costs(target, head, parts_by_size, prompts[0], k, rounds)
    target_ms = costs["target_1"]["median_ms"]
    v = costs[f"target_{k + 1}"]["median_ms"] / target_ms
    arms = {}
    for size, parts in parts_by_size.items():
        c = costs[f"head_{size}"]["median_ms"] / target_ms
        row = {"c": round(c, 3), "c_range": [round(costs[f"head_{size}"]["min_ms"] / target_ms, 3),
                                              round(costs[f"head_{size}"]["max_ms"] / target_ms, 3)]}
        for mode, sampling in SAMPLINGS.items():
            total, matches = GenerationStats(), 0
            generator = torch.Generator().manual_seed(0)
            for prompt, expected in zip(prompts, greedy, strict=True):
                drafter = EagleDrafter(head, source, k, parts=parts)
                out = speculative_generate(source, drafter, prompt, max_new_tokens=new_tokens,
                                           num_draft_tokens=k, sampling=sampling, generator=generator)
                total += out.stats
                matches += torch.equal(out.sequences, expected)
            tokens = total.tokens_per_target_call
            row[mode] = {"alpha": round(total.per_token_acceptance, 4),
                         "tokens_per_target_call": round(tokens, 3),
                         "predicted_speedup": round(tokens / (k * c + v), 3)}
            if sampling.greedy:
                row[mode]["matches_target_greedy"] = f"{matches}/{len(prompts)}"
        arms[str(size)] = row
        print(size, row, flush=True)
    vocab_facts = json.loads((TINY_DIR / "eagle-head" / "draft_vocab.json").read_text())
    return {"meta": {"prompts": num_prompts, "new_tokens": new_tokens, "num_draft_tokens": k,
                     "rounds": rounds, "clock": "CPU time of the calling thread, one torch thread",
                     "cpu": cpu_name(), "machine": platform.machine(), "dtype": "float32", "threads": 1,
                     "torch": torch.__version__,
                     "train_share_covered": vocab_facts.get("train_share_covered")},
            "costs_ms": costs, "v": round(v, 3), "by_size": arms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.write_text(json.dumps(run(args.prompts), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

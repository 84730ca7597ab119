"""Draft heads in chains and trees, counted on held-out prompts: tokens per target pass.

`python -m specdec_ref.bench.head_trees` runs, on the tiny pair's held-out prompts
(`training.corpus.held_out_prompts`, 32 tokens each, 64 new tokens), the tree decoder
(`tree.tree_speculative_generate`) with three drafts for the same target:

* the separate draft model (`load_pair("tiny")`), chapter 8's trees;
* Medusa's heads and EAGLE's head shipped in `pairs/tiny` (`heads.trees`);

each in a chain of K = 4 and in trees, greedy and at T = 0.7, where a tree's children are
drawn from q (sampled) or are q's top tokens (EAGLE-2's top-k, judged as point masses).
It records alpha's analogue for a tree (accepted over judged rounds is not defined
there, so: tokens per target pass, drafted nodes per pass, and for greedy whether the
output is the target's own), and writes `specdec_ref/data/head-trees-tiny-cpu.json`.
Counts, not times: they do not depend on the machine, so the report needs no spread.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from ..decoder import GenerationStats
from ..heads.eagle import EagleHead
from ..heads.medusa import MedusaHeads
from ..heads.trees import EagleTreeSource, FeatureTreeForward, MedusaTreeSource
from ..models import TINY_DIR, load_pair
from ..sampling import SamplingConfig
from ..training.corpus import held_out_prompts, outside_prompts
from ..trees.tree import tree_speculative_generate

PROMPTS = {"held-out": held_out_prompts, "outside": outside_prompts}
OUT = Path(__file__).resolve().parent.parent / "data" / "head-trees-tiny-cpu.json"
SHAPES = {"chain K=4": (1, 1, 1, 1), "tree (2, 2, 1, 1)": (2, 2, 1, 1), "tree (4, 2, 2, 1)": (4, 2, 2, 1)}
MODES = {"greedy": (SamplingConfig(temperature=0.0), "sampled"),
         "T=0.7, sampled children": (SamplingConfig(temperature=0.7), "sampled"),
         "T=0.7, top-k children": (SamplingConfig(temperature=0.7), "top-k")}


def run(num_prompts: int = 32, new_tokens: int = 64, seed: int = 0, domain: str = "held-out") -> dict:
    """{draft: {shape: {mode: figures}}} over held-out prompts, or prompts from outside the
    training domain (`training.corpus.outside_prompts`: CPython's test suite)."""
    if domain not in PROMPTS:
        raise ValueError(f"domain must be one of {sorted(PROMPTS)}, got {domain!r}")
    draft_model, target, tokenizer = load_pair("tiny", device="cpu")
    prompts = PROMPTS[domain](tokenizer, num_prompts=num_prompts, prompt_tokens=32, seed=seed)
    source = FeatureTreeForward(target)
    drafts = {"separate draft": draft_model,
              "Medusa heads": MedusaTreeSource(MedusaHeads.load(TINY_DIR / "medusa-heads", target), source),
              "EAGLE head": EagleTreeSource(EagleHead.load(TINY_DIR / "eagle-head", target), source)}
    greedy = [target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=new_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0) for p in prompts]
    report: dict = {}
    for name, draft in drafts.items():
        verifier = target if name == "separate draft" else source
        for shape, widths in SHAPES.items():
            for mode, (sampling, children) in MODES.items():
                total, matches = GenerationStats(), 0
                generator = torch.Generator().manual_seed(seed)
                for prompt, expected in zip(prompts, greedy, strict=True):
                    out = tree_speculative_generate(verifier, draft, prompt, max_new_tokens=new_tokens,
                                                    widths=widths, sampling=sampling, generator=generator,
                                                    children=children)
                    total += out.stats
                    matches += torch.equal(out.sequences, expected)
                row = {"tokens_per_target_call": round(total.tokens_per_target_call, 3),
                       "drafted_per_target_call": round(total.drafted_tokens / total.target_calls, 2),
                       "target_calls": total.target_calls, "new_tokens": total.new_tokens}
                if sampling.greedy:
                    row["matches_target_greedy"] = f"{matches}/{len(prompts)}"
                report.setdefault(name, {}).setdefault(shape, {})[mode] = row
                print(name, shape, mode, row, flush=True)
    return {"meta": {"domain": domain, "prompts": num_prompts,
                     "prompt_tokens": 32, "new_tokens": new_tokens, "seed": seed,
                     "machine": platform.machine(), "torch": torch.__version__,
                     "note": "counts, not times: the same on any CPU"},
            "results": report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--domain", choices=sorted(PROMPTS), default="held-out",
                        help="held-out prompts, or prompts from outside the training domain")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: data/head-trees-tiny-cpu.json (held-out) or head-trees-outside-tiny-cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = run(args.prompts, domain=args.domain)
    out = args.out or (OUT if args.domain == "held-out" else OUT.with_name("head-trees-outside-tiny-cpu.json"))
    out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tree drafts against the chain and `generate` on the tiny pair: a quick, indicative timing.

    nice -n 5 .venv/bin/python scripts/tree_speed.py                 # bfloat16, packed, 1 thread
    .venv/bin/python scripts/tree_speed.py --dtype float32 --no-pack --threads 2
    .venv/bin/python scripts/tree_speed.py --prepare                 # fast.prepare's path

The benchmark's prompts (`bench.pair.bench_prompts`: held-out corpus prompts of 32
tokens), greedy by default (--temperature for sampling), `max_new_tokens` per run.
Arms: `generate` (the target alone, transformers' own loop), the chain
(`speculative_generate`, K = 4) and `tree.tree_speculative_generate` for a few shapes,
all on the same models: the dtype given (bfloat16 where the CPU computes it natively)
with linear layers prepacked by oneDNN (`fast.packed`; --no-pack: as loaded) and
transformers' sdpa attention. With --prepare, `fast.prepare` sets the pair up instead:
`generate` and the chain run its path (the chain with its lean draft); the tree runs the
prepared models themselves (its target's grouped attention hands a tree's non-causal
mask to sdpa; the lean draft takes no mask, so the tree drafts with the prepared model).

Each repeat runs every arm in turn on every prompt, so a drift in a shared machine's
load hits all arms alike; the table gives medians over prompts and repeats, on the wall
clock and as the process's CPU time (with one thread, the CPU time leaves out the time
spent waiting for a core). Nothing is written: the numbers are indicative, for the
benchmark's tree arms to measure properly.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.bench.pair import bench_prompts, load_bench_pair
from specdec_ref.fast.packed import pack_linear_layers
from specdec_ref.fast.prepared import cpu_computes_bfloat16, prepare
from specdec_ref.tree import ConfidentShape, tree_speculative_generate

SHAPES = ((1, 1, 1, 1), (2, 2, 1, 1), (3, 2, 1), (3, 2, 2, 1), (4, 2, 2, 1, 1))


def parse_shapes(text: str) -> tuple:
    """'3,2,1;c4,4,4/3' -> ((3, 2, 1), ConfidentShape((4, 4, 4), top=3))."""
    shapes = []
    for shape in filter(None, text.split(";")):
        if shape.startswith("c"):
            levels, _, top = shape[1:].partition("/")
            shapes.append(ConfidentShape(tuple(int(n) for n in levels.split(",")), int(top or 4)))
        else:
            shapes.append(tuple(int(w) for w in shape.split(",")))
    return tuple(shapes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--no-pack", action="store_true", help="keep the linear layers as loaded")
    parser.add_argument("--prepare", action="store_true", help="fast.prepare's path (--dtype, --no-pack ignored)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES, help="e.g. '3,2,1;2,2,1,1'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.prepare else getattr(torch, args.dtype)
    if dtype is torch.bfloat16 and not cpu_computes_bfloat16():
        print("note: this CPU has no native bfloat16 arithmetic; bfloat16 will be slow")
    pair = load_bench_pair("tiny", dtype=dtype)
    target, draft = pair.target_model, pair.draft_model
    chain_target, chain_draft, setup = target, draft, f"{args.dtype}, {'not ' if args.no_pack else ''}packed"
    if args.prepare:
        fast = prepare(draft, target)
        chain_target, chain_draft = fast.target, fast.draft
        setup = "fast.prepare: " + "; ".join(f"{name} {why}" for name, why in fast.choices.items())
    elif not args.no_pack:
        pack_linear_layers(target, rows=16)
        pack_linear_layers(draft, rows=8)
    prompts, source = bench_prompts(pair, args.prompts, prompt_tokens=32)
    sampling = SamplingConfig(temperature=args.temperature)
    new = args.max_new_tokens
    generate_kwargs = {"max_new_tokens": new, "min_new_tokens": new, **sampling.generate_kwargs()}

    def arms(prompt: torch.Tensor, seed: int) -> dict:
        def gen() -> torch.Tensor:
            torch.manual_seed(seed)
            return target.generate(prompt, attention_mask=torch.ones_like(prompt), **generate_kwargs)

        common = {"max_new_tokens": new, "sampling": sampling}
        runs = {"generate": gen,
                "chain K=4": lambda: speculative_generate(chain_target, chain_draft, prompt, num_draft_tokens=4,
                                                          generator=torch.Generator().manual_seed(seed), **common)}
        for shape in args.shapes:
            runs[f"tree {shape}"] = (lambda shape=shape: tree_speculative_generate(
                chain_target, chain_draft, prompt, widths=shape, generator=torch.Generator().manual_seed(seed), **common))
        return runs

    rows: dict[str, dict[str, list]] = {}
    with torch.no_grad():
        for prompt in prompts[:1]:  # warm-up: every arm once
            for run in arms(prompt, 0).values():
                run()
        for repeat in range(args.repeats):
            for index, prompt in enumerate(prompts):
                reference = None
                for name, run in arms(prompt, repeat * 1000 + index).items():
                    wall, cpu = time.perf_counter(), time.process_time()
                    out = run()
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    sequences = out if isinstance(out, torch.Tensor) else out.sequences
                    reference = sequences if reference is None else reference
                    row = rows.setdefault(name, {"wall": [], "cpu": [], "per_pass": [], "same": []})
                    row["wall"].append(wall)
                    row["cpu"].append(cpu)
                    if not isinstance(out, torch.Tensor):
                        row["per_pass"].append(out.stats.tokens_per_target_call)
                    row["same"].append(torch.equal(sequences, reference))

    print(f"{pair.description}; {setup}; {args.threads} thread(s), torch {torch.__version__}")
    print(f"{len(prompts)} prompts ({source}), {args.repeats} repeats, {new} new tokens, "
          f"temperature {args.temperature}")
    base_wall = statistics.median(rows["generate"]["wall"])
    base_cpu = statistics.median(rows["generate"]["cpu"])
    print(f"{'arm':<24} {'wall s':>7} {'cpu s':>7} {'x wall':>7} {'x cpu':>7} {'tok/pass':>8}  same tokens as generate")
    for name, row in rows.items():
        wall, cpu = statistics.median(row["wall"]), statistics.median(row["cpu"])
        per_pass = f"{statistics.mean(row['per_pass']):.2f}" if row["per_pass"] else "1.00"
        same = f"{sum(row['same'])}/{len(row['same'])}" if sampling.greedy else "-"
        print(f"{name:<24} {wall:7.3f} {cpu:7.3f} {base_wall / wall:7.2f} {base_cpu / cpu:7.2f} {per_pass:>8}  {same}")


if __name__ == "__main__":
    main()

"""Tokens per second against batch size: batched speculative decoding, batched target-only
`generate`, and the sequential loop of `speculative_generate` (writes specdec_ref/data/batched-throughput.json).

Run (about 5 minutes on one core of a shared 2-core machine):

    nice -n 5 .venv/bin/python scripts/batched_throughput.py

The tiny pair, float32, greedy, 64 new tokens per row, K = 4, one thread. Prompts are held-out
corpus prompts cut to lengths from 16 to 32 tokens, so every batch mixes lengths. Each repeat
runs the arms in turn at every batch size (a drift in the machine's load then hits all arms
alike); the table holds medians. Every time is taken twice: on the wall clock and as the
process's CPU time. With one thread the two agree on an idle machine; on a shared one the CPU
time leaves out the time the process waited for a core, so the `*_cpu` columns are the ones to
compare across runs. The pass costs that explain the table are measured with
`specdec_ref.batched.BatchedForward`, the batched cached pass the decoder runs:
c(B) = draft pass / target pass over one token per row, v(B) = target pass over K + 1 tokens
per row / over one token per row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

from specdec_ref import SamplingConfig, load_pair, speculative_generate
from specdec_ref.batched import BatchedForward, batched_speculative_generate
from specdec_ref.reports import REPORTS_DIR
from specdec_ref.timing import cpu_name
from specdec_ref.training.corpus import held_out_prompts

GREEDY = SamplingConfig(temperature=0.0)
OUT = REPORTS_DIR / "batched-throughput.json"


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process, result) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def hf_generate(target, prompts, max_new_tokens, pad):
    """transformers' greedy generate over the prompts left-padded into one batch."""
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.full((width - len(p),), pad), p]) for p in prompts])  # (B, W)
    mask = torch.stack([torch.cat([torch.zeros(width - len(p)), torch.ones(len(p))]) for p in prompts]).long()
    out = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                          do_sample=False, pad_token_id=pad)
    return [out[b, width:] for b in range(len(prompts))]


def pass_costs(target, draft, prompts, k, repeats):
    """c(B) and v(B) from batched cached passes at the prompts' context plus 32 tokens."""
    rows = [p.tolist() + [5] * 32 for p in prompts]
    extra = list(range(10, 10 + k + 1))

    def one_pass(model, m):
        source = BatchedForward(model, len(rows))
        source.last_logits(rows, 1)  # prefill
        keep = [len(row) for row in rows]

        def run():
            source.last_logits([row + extra[:m] for row in rows], m)
            source.rollback(keep)

        run()  # warm-up
        return run

    # Round-robin, one timed pass of each kind per round: load changes hit all three alike.
    passes = {"target_1": one_pass(target, 1), "target_k1": one_pass(target, k + 1), "draft_1": one_pass(draft, 1)}
    samples = {name: [] for name in passes}
    for _ in range(repeats):
        for name, run in passes.items():
            samples[name].append(timed(run)[1])
    ms = {name: 1e3 * statistics.median(values) for name, values in samples.items()}
    return {f"{name}_cpu_ms": value for name, value in ms.items()} | {
        "c": ms["draft_1"] / ms["target_1"], "v": ms["target_k1"] / ms["target_1"]}


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="1,2,4,8,16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    draft, target, tokenizer = load_pair("tiny", device="cpu")
    for model in (draft, target):
        model.generation_config.eos_token_id = None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    base = held_out_prompts(tokenizer, num_prompts=max(sizes), prompt_tokens=32, seed=0)
    prompts = [p[0, : 16 + (7 * i) % 17] for i, p in enumerate(base)]  # lengths 16..32, mixed
    n, k = args.max_new_tokens, args.k

    def batched_spec(ps):
        outs = batched_speculative_generate(target, draft, ps, max_new_tokens=n, num_draft_tokens=k, sampling=GREEDY)
        return [out.sequences[0, len(p):] for p, out in zip(ps, outs, strict=True)]

    def sequential_one(p):
        return speculative_generate(target, draft, p[None], max_new_tokens=n, num_draft_tokens=k,
                                    sampling=GREEDY).sequences[0, len(p):]

    arms = {"batched_speculative": batched_spec, "batched_generate": lambda ps: hf_generate(target, ps, n, pad)}
    batched_spec(prompts[:2])  # warm-up
    names = [*arms, "sequential_speculative"]
    wall = {arm: {b: [] for b in sizes} for arm in names}
    cpu = {arm: {b: [] for b in sizes} for arm in names}
    outputs = {}
    started, load_at_start = time.perf_counter(), os.getloadavg()[0]
    for _ in range(args.repeats):
        for b in sizes:
            for arm, run in arms.items():
                w, c, outputs[arm, b] = timed(lambda run=run, b=b: run(prompts[:b]))
                wall[arm][b].append(w)
                cpu[arm][b].append(c)
        # The sequential loop over B prompts is the sum of its B calls: each prompt is
        # timed once per repeat, and the loop's time at B sums the first B of them.
        calls = [timed(lambda p=p: sequential_one(p)) for p in prompts]
        for b in sizes:
            wall["sequential_speculative"][b].append(sum(w for w, _, _ in calls[:b]))
            cpu["sequential_speculative"][b].append(sum(c for _, c, _ in calls[:b]))
            outputs["sequential_speculative", b] = [tokens for _, _, tokens in calls[:b]]
    seconds = time.perf_counter() - started
    rows = []
    for b in sizes:
        row = {"batch_size": b}
        for arm in names:
            row[f"{arm}_tokens_per_s"] = b * n / statistics.median(wall[arm][b])
            row[f"{arm}_tokens_per_cpu_s"] = b * n / statistics.median(cpu[arm][b])
        row["speculative_over_generate"] = (row["batched_speculative_tokens_per_s"]
                                            / row["batched_generate_tokens_per_s"])
        row["speculative_over_generate_cpu"] = (row["batched_speculative_tokens_per_cpu_s"]
                                                / row["batched_generate_tokens_per_cpu_s"])
        # Exactness on the side: batched rows equal the sequential rows (and generate's), token for token.
        for other, key in (("sequential_speculative", "rows_equal_to_sequential"),
                           ("batched_generate", "rows_equal_to_hf_generate")):
            row[key] = sum(torch.equal(x, y) for x, y in zip(outputs["batched_speculative", b], outputs[other, b],
                                                             strict=True))
        stats = [out.stats for out in batched_speculative_generate(
            target, draft, prompts[:b], max_new_tokens=n, num_draft_tokens=k, sampling=GREEDY)]
        # The batch runs until its slowest row is done: max iterations target passes.
        row["target_passes"] = max(s.iterations for s in stats)
        row["tokens_per_row_pass"] = sum(s.new_tokens for s in stats) / sum(s.target_calls for s in stats)
        row.update(pass_costs(target, draft, prompts[:b], k, repeats=21))
        # The performance model: n target passes of one token per row, against
        # target_passes iterations of K draft passes and one (K + 1)-token target pass.
        row["predicted_speedup"] = n / (row["target_passes"] * (k * row["c"] + row["v"]))
        rows.append(row)
    stats = [out.stats for out in batched_speculative_generate(
        target, draft, prompts, max_new_tokens=n, num_draft_tokens=k, sampling=GREEDY)]
    report = {
        "meta": {
            "what": "tokens/s against batch size; greedy; batched speculative vs batched target-only generate "
                    "vs sequential speculative_generate",
            "pair": "tiny", "dtype": "float32", "device": "cpu", "machine": platform.machine(),
            "processor": cpu_name(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "max_new_tokens": n, "num_draft_tokens": k, "repeats": args.repeats, "statistic": "median",
            "prompt_lengths": [len(p) for p in prompts], "prompt_source": "specdec_ref.training.corpus held-out",
            "alpha_estimate": sum(s.accepted_tokens for s in stats) / sum(s.judged_tokens for s in stats),
            "tokens_per_target_call": sum(s.new_tokens for s in stats) / sum(s.target_calls for s in stats),
            "seconds": seconds,
            "load_average_1min": [load_at_start, os.getloadavg()[0]],  # at start and end, over all cores
            "clocks": "*_tokens_per_s: wall clock; *_tokens_per_cpu_s: the process's CPU time (leaves out "
                      "waiting for a core on a shared machine)",
            "cost_columns": "c = draft pass / target pass over 1 token per row; v = target pass over K + 1 tokens "
                            "per row / over 1 token per row (BatchedForward, context = prompt + 32, CPU time, "
                            "medians of 21)",
            "predicted_speedup": "max_new_tokens / (target_passes * (K c + v)): the performance model, "
                                 "without Python overhead and without the batch shrinking as rows finish",
        },
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print("tokens/s by wall clock | by CPU time (b-spec: batched speculative, b-gen: batched generate, "
          "seq: sequential speculative)")
    print(f"{'B':>3} {'b-spec':>7} {'b-gen':>7} {'seq':>5} | {'b-spec':>7} {'b-gen':>7} {'seq':>5} "
          f"{'spec/gen':>8} {'model':>6} {'c':>6} {'v':>5}")
    for r in rows:
        wall_cells = [r[f"{arm}_tokens_per_s"] for arm in names]
        cpu_cells = [r[f"{arm}_tokens_per_cpu_s"] for arm in names]
        print(f"{r['batch_size']:>3} {wall_cells[0]:>7.0f} {wall_cells[1]:>7.0f} {wall_cells[2]:>5.0f} | "
              f"{cpu_cells[0]:>7.0f} {cpu_cells[1]:>7.0f} {cpu_cells[2]:>5.0f} "
              f"{r['speculative_over_generate_cpu']:>8.2f} {r['predicted_speedup']:>6.2f} {r['c']:>6.3f} "
              f"{r['v']:>5.2f}")
    return report


if __name__ == "__main__":
    main()

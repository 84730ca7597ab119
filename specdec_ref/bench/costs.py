"""One reference value per cost: c, v(K), tau_p and tau_q, timed over rounds with their spread.

A single timing of c = tau_q / tau_p on a shared CPU moves from run to run (0.10 to
0.22 for the tiny pair at one thread), so a page that times it live and quotes the
result states whatever the machine's load was at that moment. This module times the
costs `analysis.expected_speedup` needs, `rounds` times with `scale.measure_size`, and
keeps every round, so that the book quotes one median per quantity and setting, next
to its min-max range over the rounds.

`python -m specdec_ref.bench.costs` writes `specdec_ref/data/costs-tiny-cpu.json`;
`reference_costs()` reads it back. At one torch thread it times with the calling
thread's CPU time (`time.thread_time`), which the other jobs of a shared machine do not
inflate; with more threads, the work leaves the calling thread and wall time is kept.

Invariant: a summary's median lies within its [min, max], and v(0) = 1 in every round.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel

from ..analysis import expected_speedup, optimal_draft_length
from ..reports import REPORTS_DIR, read_report
from ..timing import cpu_flags, cpu_name
from .scale import SizePoint, measure_size

REPORT = "costs-tiny-cpu.json"
CONTEXT, MAX_K = 64, 8  # the setting of chapters 2, 6 and 12


@dataclass(frozen=True)
class ReferenceCosts:
    """The medians over rounds of a costs report, and their min-max ranges."""

    cost_ratio: float  # c = tau_q / tau_p, median over rounds
    verify_cost: dict[int, float]  # v(K) for K = 0..max_k, medians
    target_step_s: float  # tau_p, median seconds of a 1-token target pass
    draft_step_s: float  # tau_q, median seconds of a 1-token draft pass
    cost_ratio_range: tuple[float, float]  # (min, max) of c over rounds
    verify_cost_range: dict[int, tuple[float, float]]  # (min, max) of each v(K)
    target_step_range: tuple[float, float]  # (min, max) of tau_p
    draft_step_range: tuple[float, float]  # (min, max) of tau_q
    rounds: int  # how many rounds the medians are over
    per_round: tuple[tuple[float, dict[int, float]], ...]  # (c, v(K)) of each round
    clock: str  # the meta.clock: "thread_time: ..." (CPU time) or "perf_counter: ..." (wall)

    def within_noise(self, k: int, other: int) -> bool:
        """Whether v(k) and v(other) are inside each other's range: no ranking between them."""
        (low, high), (low2, high2) = self.verify_cost_range[k], self.verify_cost_range[other]
        return low <= high2 and low2 <= high

    def speedup_range(self, alpha: float, k: int) -> tuple[float, float]:
        """S(K) at the median c with v(K) at the top and at the bottom of its range."""
        low, high = self.verify_cost_range[k]
        return (expected_speedup(alpha, k, self.cost_ratio, {k: high}),
                expected_speedup(alpha, k, self.cost_ratio, {k: low}))

    def near_best(self, alpha: float, *, max_k: int = MAX_K) -> list[int]:
        """The K in 1..max_k whose `speedup_range` reaches that of the best K at the medians."""
        best = optimal_draft_length(alpha, self.cost_ratio, max_k=max_k, verify_cost=self.verify_cost)
        floor = self.speedup_range(alpha, best)[0]
        return [k for k in range(1, max_k + 1) if self.speedup_range(alpha, k)[1] >= floor]

    def best_k_by_round(self, alpha: float, *, max_k: int = MAX_K) -> list[int]:
        """The best K of each round, from that round's own c and v(K)."""
        return [optimal_draft_length(alpha, c, max_k=max_k, verify_cost=v) for c, v in self.per_round]


def measure_rounds(draft_model: PreTrainedModel, target_model: PreTrainedModel, *, rounds: int = 7,
                   repeats: int = 20, name: str = "tiny", clock=time.perf_counter) -> list[SizePoint]:
    """`scale.measure_size` `rounds` times in a row: each round's tau_p, tau_q and v(K).

    Raises:
        ValueError: if `rounds` or `repeats` is not a positive integer.
    """
    for label, value in (("rounds", rounds), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    with torch.no_grad():
        return [measure_size(draft_model, target_model, name=name, context=CONTEXT, max_k=MAX_K,
                             repeats=repeats, clock=clock) for _ in range(rounds)]


def spread(values: Sequence[float], digits: int | None = None) -> dict[str, float]:
    """The median and the min-max range of `values` (rounded to `digits` when given)."""
    summary = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return summary if digits is None else {key: round(value, digits) for key, value in summary.items()}


def costs_report(points: Sequence[SizePoint], meta: Mapping) -> dict:
    """The rounds and their summary as plain data (what `main` writes as JSON)."""
    rounds = [{"tau_p": p.target_step_s, "tau_q": p.draft_step_s, "c": p.cost_ratio,
               "verify_cost": {str(k): v for k, v in p.verify_cost.items()}} for p in points]
    # One median and its range per quantity, over the rounds.
    summary = {key: spread([r[key] for r in rounds]) for key in ("tau_p", "tau_q", "c")}
    summary["verify_cost"] = {k: spread([r["verify_cost"][k] for r in rounds]) for k in rounds[0]["verify_cost"]}
    return {"meta": dict(meta), "rounds": rounds, "summary": summary}


def costs_from_report(data: Mapping) -> ReferenceCosts:
    """A `ReferenceCosts` from a report's parsed JSON (`costs_report`'s shape)."""
    summary = data["summary"]

    def pair(entry: Mapping) -> tuple[float, float]:
        return entry["min"], entry["max"]

    verify = {int(k): v for k, v in summary["verify_cost"].items()}
    return ReferenceCosts(
        cost_ratio=summary["c"]["median"], verify_cost={k: v["median"] for k, v in verify.items()},
        target_step_s=summary["tau_p"]["median"], draft_step_s=summary["tau_q"]["median"],
        cost_ratio_range=pair(summary["c"]), verify_cost_range={k: pair(v) for k, v in verify.items()},
        target_step_range=pair(summary["tau_p"]), draft_step_range=pair(summary["tau_q"]),
        rounds=len(data["rounds"]), clock=data["meta"]["clock"],
        per_round=tuple((r["c"], {int(k): v for k, v in r["verify_cost"].items()}) for r in data["rounds"]))


def reference_costs(name: str = REPORT) -> ReferenceCosts:
    """The committed reference costs (`reports.read_report(name)`), medians and ranges."""
    return costs_from_report(read_report(name))


def main(argv: list[str] | None = None) -> dict:
    """Time the pair's costs over rounds and write the report."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench.costs", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny", help="the embedded pair to time (as the notebooks load it)")
    parser.add_argument("--rounds", type=int, default=7, help="repetitions of the whole measurement")
    parser.add_argument("--repeats", type=int, default=20, help="timed passes of each size per round")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=REPORTS_DIR / REPORT)
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    from ..models import load_pair

    # The pair as the chapters load it on a CPU: float32, as loaded, no prepacking.
    torch.set_num_threads(args.threads)
    loaded = load_pair(args.pair, device="cpu")
    draft_model, target_model = loaded.draft_model.eval(), loaded.target_model.eval()
    # CPU time of this thread where all the work runs on it (one thread), else wall time.
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    points = measure_rounds(draft_model, target_model, rounds=args.rounds, repeats=args.repeats,
                            name=args.pair, clock=clock)
    meta = {"pair": args.pair, "dtype": str(next(target_model.parameters()).dtype).removeprefix("torch."),
            "linear": "as loaded", "device": "cpu", "threads": torch.get_num_threads(), "context": CONTEXT,
            "max_k": MAX_K, "rounds": args.rounds, "repeats": args.repeats, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "date": datetime.datetime.now().astimezone().isoformat(), "cpu_model": cpu_name(),
            "cpu_flags": cpu_flags(),
            "clock": ("thread_time: CPU time of the calling thread (one torch thread does all the work)"
                      if clock is time.thread_time else "perf_counter: wall time (several threads)")}
    report = costs_report(points, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    s = report["summary"]
    print(f"c = {s['c']['median']:.3f} ({s['c']['min']:.3f}-{s['c']['max']:.3f}) over {args.rounds} rounds; "
          f"tau_p {s['tau_p']['median'] * 1e3:.2f} ms, tau_q {s['tau_q']['median'] * 1e3:.2f} ms")
    print("v(K): " + "  ".join(f"{k}: {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
                               for k, v in s["verify_cost"].items()))
    return report


if __name__ == "__main__":
    main()

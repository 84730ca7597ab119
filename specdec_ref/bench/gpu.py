"""What `scripts/gpu_check.sh` asks of Python: the machine it runs on, and a check of each report.

`python -m specdec_ref.bench.gpu versions` prints torch, transformers, whether CUDA is
there and the GPU's name. `python -m specdec_ref.bench.gpu check REPORT...` reads
benchmark reports (`python -m specdec_ref.bench --out REPORT`) and prints one line per
report: the GPU, the pair, the dtype, the best speculative arm's speedup in each mode,
and whether every greedy arm reproduced the baseline's tokens.

Invariant: `check` exits non-zero unless every report was measured on a CUDA device and
names it (`meta.device_name`), so a report from the wrong machine never reaches
`specdec_ref/data/` as a GPU result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def versions() -> str:
    """torch, transformers, CUDA and the GPU's name, on two lines."""
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else "-"
    return (f"torch {torch.__version__} transformers {transformers.__version__}\n"
            f"cuda {cuda} {name} (CUDA {torch.version.cuda or '-'})")


def report_problems(report: dict) -> list[str]:
    """What makes `report` unfit as a GPU result (empty when it is fit)."""
    meta = report.get("meta", {})
    problems = []
    if not str(meta.get("device", "")).startswith("cuda"):
        problems.append(f"measured on {meta.get('device')!r}, not on a CUDA device")
    if not meta.get("device_name"):
        problems.append("meta.device_name (the GPU's name) is missing")
    if not report.get("arms"):
        problems.append("no arms were measured")
    return problems


def summary_line(report: dict) -> str:
    """One line: GPU, pair, dtype, per mode the best speculative arm of each implementation
    (speedup over target-only `generate`), and whether greedy arms matched the baseline."""
    meta = report["meta"]
    modes = []
    for mode in meta.get("modes", []):
        best = []
        for impl in ("specdec_ref", "transformers"):
            arms = [arm for arm in report["arms"] if arm["mode"] == mode and arm["impl"] == impl
                    and arm.get("schedule") is not None and arm.get("speedup") is not None]
            if arms:
                top = max(arms, key=lambda arm: arm["speedup"])
                best.append(f"{top['name']} {top['speedup']:.2f}x")
        modes.append(f"{mode}: {', '.join(best) or '-'}")
    greedy = {None: "-", True: "yes", False: "NO"}[report.get("greedy_identical")]
    return (f"{meta.get('device_name')} | {meta.get('pair')} {meta.get('dtype')} | {' | '.join(modes)}"
            f" | greedy identical: {greedy}")


def check(paths: list[Path]) -> int:
    """Print a line per report; return 1 if any is missing or unfit, else 0."""
    status = 0
    for path in paths:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            print(f"{path}: cannot be read: {error}")
            status = 1
            continue
        problems = report_problems(report)
        if problems:
            print(f"{path}: {'; '.join(problems)}")
            status = 1
        else:
            print(f"{path}: {summary_line(report)}")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench.gpu", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("versions", help="torch, transformers, CUDA and the GPU's name")
    checked = commands.add_parser("check", help="check benchmark reports measured on a GPU")
    checked.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "versions":
        print(versions())
        return 0
    return check(args.reports)


if __name__ == "__main__":
    sys.exit(main())

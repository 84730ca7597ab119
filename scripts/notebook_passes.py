"""Every chapter in every notebook pass of `make test`, two notebooks at a time.

    python scripts/notebook_passes.py [--passes nbval,half,colab] [--jobs 2]
                                      [--colab-venv .venv-colab] [--times FILE]

The passes (each runs every notebook in notebooks/):

* nbval: float32 against the stored outputs (`pytest --nbval`, sanitized by
  tests/nbval_sanitize.cfg). The outputs were written with one torch thread
  (`make execute`); this pass uses two, which changes the order of float reductions
  the way another CPU does, so an output that depends on the last bits fails here.
* half: the tiny pair in bfloat16, as a half-precision GPU pair runs on Colab; only
  errors and the notebooks' own asserts count (`--nbval-lax`).
* colab: the chapters as a Colab learner runs them, twice: a kernel whose environment
  holds only what Colab preinstalls and the package (installed here as the set-up cell
  installs it, no book or dev extra), with the article's pair (SPECDEC_PAIR=gpt2) from a
  stand-in hub, offline (scripts/standin_hub.py): "colab-disagree" (two random models,
  alpha near 0) and "colab-agree" (alpha near 1). `--nbval-lax`. Skipped, with a note,
  where GPT-2's tokenizer files cannot be fetched (no npm).

One job is one pytest process over one notebook (nbval runs a notebook's cells in one
kernel, in order). The jobs of all passes share `--jobs` slots, longest first
(`COSTS`), so both cores work until the last one ends. A failing job's whole log is
printed; then, per pass, the seconds its notebooks took (run side by side, so they add
up to more than the wall time). Exit 1 if any job failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
KERNEL = "specdec-colab"
PASSES = ("nbval", "half", "colab")
# A notebook's rough cost relative to the others (seconds of its cells in one bfloat16
# run on one core), only to start the longest jobs first; one not listed counts 30.
COSTS = {"09": 165, "08": 65, "10": 60, "11": 60, "05": 45, "12": 45, "06": 30, "04": 25, "07": 25,
         "01": 15, "03": 15, "00": 15, "02": 10}
# Imports the Colab-like kernel must not have: the book's and the tests' tools.
NOT_ON_COLAB = ("myst_nb", "nbval", "pytest", "jupyter_book", "scipy")


@dataclass(frozen=True)
class Job:
    """One notebook in one pass: its pytest arguments and extra environment."""

    name: str  # the pass, e.g. "half"
    notebook: Path
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def cost(self) -> float:
        stem = self.notebook.name.split("-")[0]
        return COSTS.get(stem, 30) * (1.5 if self.name == "nbval" else 1.0)


@dataclass
class Done:
    job: Job
    seconds: float
    returncode: int
    log: str


def prepare_colab(venv: Path, work: Path) -> dict[str, Path] | None:
    """Install the package into `venv` as the set-up cell does, check what it must not
    import, build the two stand-in hubs; None when the tokenizer files are missing."""
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)]
    subprocess.run(pip, check=True)  # --no-deps: `make setup` installed the libraries
    for module in NOT_ON_COLAB:
        probe = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {module}"],
                               capture_output=True)
        if probe.returncode == 0:
            sys.exit(f"notebook passes: {module} is importable in {venv}; it must not be")
    hubs = {}
    for stand in ("disagree", "agree"):
        hubs[stand] = work / stand
        flags = ["--agree"] if stand == "agree" else []
        built = subprocess.run([PYTHON, str(ROOT / "scripts" / "standin_hub.py"),
                                str(hubs[stand]), *flags], capture_output=True, text=True)
        # its summary lines; the libraries' progress bars stay out of the log
        print("".join(line + "\n" for line in built.stdout.splitlines() if line.startswith("standin")), end="")
        if built.returncode == 3:
            print("notebook passes: colab skipped (no GPT-2 tokenizer files)")
            return None
        if built.returncode != 0:
            sys.exit(f"notebook passes: standin_hub.py failed ({built.returncode}):\n{built.stderr}")
    return hubs


def jobs_of(name: str, notebooks: list[Path], venv: Path, hubs: dict[str, Path] | None) -> list[Job]:
    """The jobs of one pass, one per notebook."""
    passive = (("OMP_WAIT_POLICY", "PASSIVE"),)
    if name == "nbval":
        args = ("--nbval", "--nbval-current-env", "--nbval-sanitize-with",
                str(ROOT / "tests" / "nbval_sanitize.cfg"))
        setting = {"nbval": (("SPECDEC_THREADS", "2"), *passive)}
    elif name == "half":
        args = ("--nbval-lax", "--nbval-current-env")
        setting = {"half": (("SPECDEC_DTYPE", "bfloat16"), *passive)}
    else:
        if hubs is None:
            return []
        args = ("--nbval-lax", "--nbval-kernel-name", KERNEL)
        kernels = str((venv / "share" / "jupyter").resolve())
        setting = {f"colab-{stand}": (("HF_HOME", str(hub)), ("HF_HUB_OFFLINE", "1"),
                                      ("SPECDEC_PAIR", "gpt2"), ("SPECDEC_THREADS", "1"),
                                      ("JUPYTER_PATH", kernels), *passive)
                   for stand, hub in hubs.items()}
    return [Job(label, notebook, args, env) for label, env in setting.items() for notebook in notebooks]


def run(job: Job) -> Done:
    env = dict(os.environ, **dict(job.env))
    if job.name in ("nbval", "half"):
        env.pop("SPECDEC_PAIR", None)  # the tiny pair, whatever the shell says
    command = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=3",
               *job.args, str(job.notebook)]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    done = Done(job, seconds, result.returncode, result.stdout + result.stderr)
    verdict = "passed" if done.returncode == 0 else f"FAILED ({done.returncode})"
    summary = done.log.strip().splitlines()[-1] if done.log.strip() else ""
    print(f"{job.name:15} {job.notebook.name:44} {seconds:6.0f} s  {verdict}  {summary}", flush=True)
    return done


def report(finished: list[Done], wall: float, times: Path | None) -> bool:
    """Print the failing logs and the seconds per pass; True when every job passed."""
    failed = [done for done in finished if done.returncode != 0]
    for done in failed:
        print(f"\n===== {done.job.name}: {done.job.notebook.name} =====\n{done.log}")
    print(f"\nnotebook passes: {len(finished) - len(failed)} of {len(finished)} notebook runs "
          f"passed in {wall:.0f} s of wall time; the seconds of each pass's notebooks:")
    lines = []
    for name in dict.fromkeys(done.job.name for done in finished):
        runs = [done for done in finished if done.job.name == name]
        slowest = max(runs, key=lambda done: done.seconds)
        total = sum(done.seconds for done in runs)
        print(f"  {name:15} {total:5.0f} s  (slowest {slowest.job.notebook.name}, {slowest.seconds:.0f} s)")
        lines.append(f"{name} {total:.0f} notebook-seconds\n")
    if times is not None:
        with times.open("a") as handle:
            handle.writelines(lines)
    return not failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", default=",".join(PASSES),
                        help=f"comma-separated, from {', '.join(PASSES)} (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks run at once (default 2)")
    parser.add_argument("--colab-venv", type=Path, default=ROOT / ".venv-colab",
                        help="the Colab-like environment (make setup builds .venv-colab)")
    parser.add_argument("--times", type=Path, help="append each pass's notebook-seconds here")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    args = parser.parse_args()
    passes = [name.strip() for name in args.passes.split(",") if name.strip()]
    unknown = sorted(set(passes) - set(PASSES))
    if unknown or not passes:
        parser.error(f"--passes takes names from {', '.join(PASSES)}, got {args.passes!r}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    notebooks = [path.resolve() for path in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as work:
        hubs = prepare_colab(args.colab_venv, Path(work)) if "colab" in passes else None
        jobs = [job for name in passes for job in jobs_of(name, notebooks, args.colab_venv, hubs)]
        jobs.sort(key=Job.cost, reverse=True)  # longest first: no core idles at the end
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            finished = list(pool.map(run, jobs))
        passed = report(finished, time.perf_counter() - start, args.times)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()

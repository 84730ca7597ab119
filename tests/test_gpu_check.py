"""scripts/gpu_check.sh on a CPU: its dry run, its bookkeeping with a stand-in interpreter, and
the gpt2-xl random shapes it benchmarks (checked on the meta device: no 1.76B model is built)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec_ref.bench.gpu import check, report_problems
from specdec_ref.bench.pair import RANDOM_SHAPES, RandomPairShape, random_pair
from specdec_ref.bench.run import parse_args

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
DTYPES = ("bfloat16", "float16")  # the notebooks run in both
BENCH_DTYPES = ("bfloat16",)  # the benchmark runs in these
REPORTS = [f"specdec_ref/data/bench-{name}-cuda-{dtype}.json" for dtype in BENCH_DTYPES
           for name in ("gpt2-shapes", "tiny")]


def run_script(*args: str, cwd: Path = ROOT, env: dict | None = None, script: Path = SCRIPT):
    # The limit only guards against a hang, never the machine's speed.
    return subprocess.run(["bash", str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run's output, and the folder it was given."""
    out = tmp_path_factory.mktemp("gpu") / "x"
    result = run_script("--dry-run", str(out))
    return result, out


def commands(stdout: str) -> list[list[str]]:
    """The printed commands ("+ COMMAND  (limit ...)"), split into words."""
    return [shlex.split(line[2:].split("  (limit")[0]) for line in stdout.splitlines() if line.startswith("+ ")]


def test_dry_run_exits_0_and_runs_nothing(dry_run):
    """--dry-run succeeds without a GPU and writes nothing, not even its output folder."""
    result, out = dry_run
    assert result.returncode == 0, result.stderr
    assert not out.exists()


def test_dry_run_prints_the_tests_notebooks_and_bench(dry_run):
    """The unit tests, the notebooks in both half precisions, two benchmark runs on CUDA,
    the check of their reports and their copy into the output folder, with their paths."""
    result, out = dry_run
    printed = commands(result.stdout)
    tests = [c for c in printed if c[-1] == "tests"]
    assert len(tests) == 1 and tests[0][1:3] == ["-m", "pytest"] and f"{out}/pytest.xml" in tests[0]
    notebooks = {c[1].removeprefix("SPECDEC_DTYPE="): c for c in printed if c[-1] == "notebooks/"}
    assert set(notebooks) == set(DTYPES)
    assert all(c[0] == "env" and "--nbval-lax" in c for c in notebooks.values())
    assert f"{out}/nbval-float16.log" in result.stdout and f"{out}/pytest.log" in result.stdout
    bench = [c for c in printed if c[1:3] == ["-m", "specdec_ref.bench"]]
    assert [c[c.index("--out") + 1] for c in bench] == REPORTS
    check_line = next(c for c in printed if c[1:4] == ["-m", "specdec_ref.bench.gpu", "check"])
    assert check_line[4:] == REPORTS
    assert f"+ cp {' '.join(REPORTS)} {out}/specdec_ref/data/" in result.stdout


@pytest.mark.parametrize("dtype", BENCH_DTYPES)
def test_bench_commands_parse_as_the_runs_meant(dry_run, dtype):
    """Each printed benchmark command is a valid command line: on CUDA, in its dtype, the
    article's shapes with the fast path at K = 1..8, and the tiny pair with K = 2..6 and
    the fast path, greedy and T = 1."""
    result, _ = dry_run
    bench = [c for c in commands(result.stdout) if c[1:3] == ["-m", "specdec_ref.bench"]]
    configs = {}
    for command in bench:
        config, out = parse_args(command[3:])
        if config.dtype == dtype:
            configs[config.pair] = (config, str(out))
    shapes, shapes_out = configs["gpt2-shapes"]
    assert shapes_out == f"specdec_ref/data/bench-gpt2-shapes-cuda-{dtype}.json"
    assert shapes.fast and shapes.fast_k_values == tuple(range(1, 9)) and shapes.device == "cuda"
    assert shapes.modes == ("greedy", "t1.0") and shapes.num_prompts == 1 and shapes.repeats <= 3
    tiny, tiny_out = configs["tiny"]
    assert tiny_out == f"specdec_ref/data/bench-tiny-cuda-{dtype}.json"
    assert tiny.k_values == (2, 3, 4, 5, 6) and tiny.modes == ("greedy", "t1.0") and tiny.device == "cuda"
    assert tiny.fast and tiny.num_prompts <= 6 and tiny.repeats <= 3 and 64 <= tiny.max_new_tokens <= 128


def test_the_older_llama_run_of_gpt2_xl_shapes_can_still_be_asked_for():
    """BENCH_PAIRS=gpt2xl prints the random Llama pair with GPT-2 XL's shapes."""
    result = run_script("--dry-run", "--only", "bench", "/tmp/unused", env={"BENCH_PAIRS": "gpt2xl"})
    (command,) = [c for c in commands(result.stdout) if c[1:3] == ["-m", "specdec_ref.bench"]]
    config, out = parse_args(command[3:])
    assert config.pair == "random" and config.shape == RANDOM_SHAPES["gpt2-xl"]
    assert str(out) == "specdec_ref/data/bench-gpt2xl-random-cuda-bfloat16.json"


def test_only_selects_steps_and_rejects_unknown_ones():
    """--only bench prints no test or notebook run; an unknown step is refused (exit 2)."""
    result = run_script("--dry-run", "--only", "bench", "/tmp/unused")
    assert result.returncode == 0
    printed = commands(result.stdout)
    assert not any(c[-1] in ("tests", "notebooks/") for c in printed)
    assert sum(c[1:3] == ["-m", "specdec_ref.bench"] for c in printed) == 2
    refused = run_script("--dry-run", "--only", "bench,gpu", "/tmp/unused")
    assert refused.returncode == 2 and "unknown step 'gpu'" in refused.stderr


STAND_IN = '''#!{python}
"""A stand-in interpreter for gpu_check.sh: records each call, writes a fake CUDA report
for each benchmark run, and runs the real report check."""
import json, os, sys
args = sys.argv[1:]
with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as calls:
    calls.write(" ".join(args) + "\\n")
if args[:3] == ["-m", "specdec_ref.bench.gpu", "check"]:
    os.execv(sys.executable, [sys.executable, *args])
if args[:2] == ["-m", "specdec_ref.bench"]:
    out, dtype = args[args.index("--out") + 1], args[args.index("--dtype") + 1]
    arm = {{"name": "specdec_ref k=4", "impl": "specdec_ref", "mode": "greedy", "k": 4, "schedule": "fixed",
           "speedup": 1.5}}
    report = {{"meta": {{"device": "cuda", "device_name": "Stand-in GPU", "pair": "tiny", "dtype": dtype,
                       "modes": ["greedy"]}}, "arms": [arm], "greedy_identical": True}}
    with open(out, "w") as file:
        json.dump(report, file)
'''


@pytest.fixture
def sandbox(tmp_path):
    """A copy of the script in an empty repository layout, and a stand-in interpreter."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "specdec_ref" / "data").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "scripts" / "gpu_check.sh")
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable))
    python.chmod(0o755)
    return tmp_path, {"PYTHON": str(python)}


def test_a_full_run_summarizes_checks_and_copies_the_reports(sandbox):
    """Every step runs and is summarized; the reports pass the GPU check and come back
    under OUTDIR/specdec_ref/data (the only folder a device run returns)."""
    root, env = sandbox
    result = run_script("out", cwd=root, env=env, script=root / "scripts" / "gpu_check.sh")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (root / "out" / "summary.txt").read_text()
    for name in ("versions", "unit tests", "notebooks in float16", "notebooks in bfloat16", "bench tiny bfloat16",
                 "bench gpt2shapes bfloat16", "reports name their GPU"):
        assert f"{name}" in summary and "skipped" not in summary
    for report in REPORTS:
        copied = json.loads((root / "out" / report).read_text())
        assert copied["meta"]["device_name"] == "Stand-in GPU"
    assert "Stand-in GPU | tiny bfloat16" in (root / "out" / "reports.txt").read_text()


def test_steps_that_do_not_fit_the_budget_are_skipped_and_fail_the_run(sandbox):
    """With 20 s of budget nothing but the version line fits: every other step is skipped,
    no report is written, and the script exits 1."""
    root, env = sandbox
    result = run_script("out", cwd=root, env={**env, "GPU_CHECK_BUDGET": "20"},
                        script=root / "scripts" / "gpu_check.sh")
    assert result.returncode == 1
    summary = (root / "out" / "summary.txt").read_text()
    assert summary.count("skipped") == 5  # tests, 2 notebook runs, 2 benchmark runs
    assert not list((root / "specdec_ref" / "data").iterdir())


def test_report_check_refuses_cpu_reports_and_missing_names(tmp_path):
    """A report measured on a CPU, or without the GPU's name, is not a GPU result."""
    good = {"meta": {"device": "cuda", "device_name": "NVIDIA H200", "modes": []}, "arms": [{}]}
    assert report_problems(good) == []
    assert report_problems({**good, "meta": {**good["meta"], "device": "cpu"}})
    assert report_problems({**good, "meta": {**good["meta"], "device_name": ""}})
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**good, "meta": {**good["meta"], "device": "cpu"}}))
    assert check([path]) == 1
    assert check([tmp_path / "missing.json"]) == 1


def test_gpt2_xl_preset_has_gpt2_xl_shapes():
    """48 layers x 1600 (25 heads of 64), vocabulary 50257, 1024 positions; the draft, the
    target's first 12 layers (GPT-2 small's depth). Built on the meta device: no weights."""
    shape = RANDOM_SHAPES["gpt2-xl"]
    with torch.device("meta"):
        pair = random_pair(shape, device="meta")
    target, draft = pair.target_model.config, pair.draft_model.config
    assert (target.num_hidden_layers, target.hidden_size, target.num_attention_heads) == (48, 1600, 25)
    assert target.hidden_size // target.num_attention_heads == 64
    assert (target.vocab_size, target.max_position_embeddings) == (50257, 1024)
    assert (draft.num_hidden_layers, draft.hidden_size, draft.vocab_size) == (12, 1600, 50257)
    parameters = sum(p.numel() for p in pair.target_model.parameters())
    assert 1.5e9 < parameters < 1.8e9  # GPT-2 XL: 1.56B; SwiGLU and an untied head: 1.76B
    assert next(pair.target_model.parameters()).device.type == "meta"
    assert RANDOM_SHAPES["tiny"] == RandomPairShape()


def test_random_shape_option_and_overrides():
    """--random-shape picks a preset; an explicit --random-* flag overrides one field of it."""
    config, _ = parse_args(["--pair", "random", "--random-shape", "gpt2-xl"])
    assert config.shape == RANDOM_SHAPES["gpt2-xl"]
    config, _ = parse_args(["--pair", "random", "--random-shape", "gpt2-xl", "--random-target-layers", "2",
                            "--random-draft-layers", "1", "--random-width", "64"])
    assert (config.shape.target_layers, config.shape.draft_layers, config.shape.width) == (2, 1, 64)
    assert (config.shape.vocab, config.shape.positions) == (50257, 1024)  # kept from the preset
    assert parse_args([])[0].shape == RandomPairShape()
    with pytest.raises(SystemExit):
        parse_args(["--random-shape", "gpt3"])

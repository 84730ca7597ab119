#!/usr/bin/env bash
# The GPU check, on a CUDA machine, from the repository root:
#   1. the unit tests (the exactness, greedy-equality and rollback tests also run on CUDA
#      there: tests/conftest.py DEVICES), and every notebook in float16 and in bfloat16
#      (the tiny pair on the GPU; nbval's lax mode: outputs differ from the committed
#      float32 CPU ones, so only errors and the notebooks' own asserts count). These three
#      jobs check correctness only, so they run side by side;
#   2. then, alone on the machine, the benchmark (`python -m specdec_ref.bench`) in
#      bfloat16 and float16: the tiny pair, and random-init models of GPT-2 XL's shapes
#      (`--random-shape gpt2-xl`: a 48 x 1600 target, its first 12 layers as the draft).
#      Reports: specdec_ref/data/bench-tiny-cuda-<dtype>.json and
#      specdec_ref/data/bench-gpt2xl-random-cuda-<dtype>.json, each naming the GPU
#      (meta.device_name, checked by `python -m specdec_ref.bench.gpu check`).
#
#   scripts/gpu_check.sh [--dry-run] [--only STEPS] [OUTDIR]
#   make bench-gpu
#
# --dry-run prints every command and runs nothing. --only runs a comma-separated subset
# of tests,notebooks,bench (default: all of them), to rerun a part. OUTDIR (default
# gpu-check/) receives the logs, summary.txt, pytest.xml and a copy of every report
# written, under OUTDIR/specdec_ref/data/.
#
# Time: each step has a limit, and the whole script a budget (GPU_CHECK_BUDGET seconds,
# default 480): a step never runs past it, and a benchmark that could not finish in the
# time left is skipped, not started (an interrupted one writes nothing). Sizes come from
# the H200 timings in specdec_ref/data/size-sweep-cuda.json (bf16, one 1-token cached pass: tiny
# target 5.1 ms, its draft 1.9 ms, 48 x 1600 target 30 ms): the tiny benchmark runs 44
# arms x (1 warm-up + 2 prompts) of 64 tokens, about 1 min; the gpt2-xl one 20 arms x
# (1 warm-up + 1 prompt) of 64 tokens after building 1.76B parameters on the CPU (about
# 40 s), about 1.7 min. 6 prompts x 3 repeats of 128 tokens: about 10 min per tiny run.
# TINY_SIZE and XL_SIZE override the sizes (extra arguments to the benchmark);
# BENCH_DTYPES (default "bfloat16 float16") and BENCH_PAIRS ("tiny gpt2xl") pick the runs.
#
# Needs pytest (pytest-xdist if present), scipy, nbval, ipykernel and ipywidgets; where
# the machine lacks them, put their wheels in .whl/. PYTHON picks the interpreter.
set -u
cd "$(dirname "$0")/.."
dry=0
only=tests,notebooks,bench
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1; shift ;;
        --only) only=${2:-}; shift 2 || { echo "--only needs tests,notebooks,bench or a subset" >&2; exit 2; } ;;
        --only=*) only=${1#--only=}; shift ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
for part in ${only//,/ }; do
    case "$part" in tests|notebooks|bench) ;; *) echo "--only: unknown step '$part' (tests, notebooks, bench)" >&2; exit 2 ;; esac
done
wants() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
out=${1:-gpu-check}
py=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET:-480}
started=$(date +%s)
left() { echo $(( budget - ($(date +%s) - started) )); }
TINY_SIZE=${TINY_SIZE:---num-prompts 2 --repeats 1 --max-new-tokens 64}
XL_SIZE=${XL_SIZE:---k-values 4 --num-prompts 1 --repeats 1 --max-new-tokens 64 --prompt-tokens 32 --quick}
BENCH_DTYPES=${BENCH_DTYPES:-bfloat16 float16}
BENCH_PAIRS=${BENCH_PAIRS:-tiny gpt2xl}

if [ "$dry" = 1 ]; then
    echo "dry run: nothing is run (budget ${budget} s, output in $out/)"
else
    mkdir -p "$out"
    : > "$out/summary.txt"
fi
if [ -d .whl ] && [ "$dry" != 1 ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}

# summary LINE: one line of the summary (printed, and kept in OUTDIR/summary.txt).
summary() { echo "$1" | tee -a "$out/summary.txt"; }

# step NAME LIMIT NEEDS LOG COMMAND...: run COMMAND with its output in LOG, for at most
# LIMIT seconds and never past the budget; skipped when fewer than NEEDS seconds are left.
step() {
    local name=$1 limit=$2 needs=$3 log=$4
    shift 4
    echo "+ $*  (limit ${limit} s, log $log)"
    [ "$dry" = 1 ] && return 0
    local rest
    rest=$(left)
    if [ "$rest" -lt "$needs" ]; then
        summary "$name: skipped, ${rest} s of the budget left, needs ${needs} s"
        return 1
    fi
    [ "$limit" -gt "$rest" ] && limit=$rest
    local begin=$SECONDS rc
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        summary "$name: exit $rc, stopped at its limit of ${limit} s"
    else
        summary "$name: exit $rc ($((SECONDS - begin)) s)"
    fi
    return "$rc"
}

step "versions" 60 10 "$out/versions.txt" "$py" -m specdec_ref.bench.gpu versions
[ "$dry" = 1 ] || cat "$out/versions.txt"

# 1. Correctness, three jobs side by side.
workers=(-n 8)
if [ "$dry" != 1 ] && ! "$py" -c "import xdist" 2>/dev/null; then
    workers=()
    echo "pytest-xdist is missing: the unit tests run in one process"
fi
jobs=()
# side_by_side COMMAND...: run COMMAND in the background (in a dry run, at once).
side_by_side() { if [ "$dry" = 1 ]; then "$@"; else "$@" & jobs+=($!); fi; }
if wants tests; then
    side_by_side step "unit tests (with their [cuda] cases)" 240 60 "$out/pytest.log" \
        "$py" -m pytest -q -rs -p no:cacheprovider "${workers[@]}" --junitxml "$out/pytest.xml" tests
fi
if wants notebooks; then
    for dtype in float16 bfloat16; do
        side_by_side step "notebooks in $dtype on the GPU" 240 60 "$out/nbval-$dtype.log" \
            env SPECDEC_DTYPE=$dtype "$py" -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env \
            notebooks/
    done
fi
for job in "${jobs[@]}"; do wait "$job"; done

# 2. The benchmark, one run at a time (timings must not share the machine).
reports=()
if wants bench; then
    for dtype in $BENCH_DTYPES; do
        for pair in $BENCH_PAIRS; do
            # The sizes come last: later arguments win, so TINY_SIZE / XL_SIZE may change any.
            if [ "$pair" = tiny ]; then
                report=specdec_ref/data/bench-tiny-cuda-$dtype.json
                # shellcheck disable=SC2086  # TINY_SIZE holds several arguments
                args=(--pair tiny --modes greedy,t1.0 --k-values 2,3,4,5,6 $TINY_SIZE)
                limit=150 needs=60
            elif [ "$pair" = gpt2xl ]; then
                report=specdec_ref/data/bench-gpt2xl-random-cuda-$dtype.json
                # shellcheck disable=SC2086
                args=(--pair random --random-shape gpt2-xl --modes greedy,t1.0 $XL_SIZE)
                limit=180 needs=90
            else
                summary "bench $pair: unknown pair in BENCH_PAIRS (tiny, gpt2xl)"
                continue
            fi
            if step "bench $pair $dtype" "$limit" "$needs" "$out/bench-$pair-$dtype.log" \
                "$py" -m specdec_ref.bench "${args[@]}" --device cuda --dtype "$dtype" --out "$report" --no-progress
            then
                reports+=("$report")
            fi
        done
    done
    if [ "${#reports[@]}" -gt 0 ]; then
        step "reports name their GPU" 60 5 "$out/reports.txt" "$py" -m specdec_ref.bench.gpu check "${reports[@]}"
        echo "+ cp ${reports[*]} $out/specdec_ref/data/"
        if [ "$dry" != 1 ]; then
            cat "$out/reports.txt"
            mkdir -p "$out/specdec_ref/data" && cp "${reports[@]}" "$out/specdec_ref/data/"
        fi
    fi
fi

[ "$dry" = 1 ] && exit 0
echo "total: $(( $(date +%s) - started )) s of a ${budget} s budget" | tee -a "$out/summary.txt"
echo "--- summary"
cat "$out/summary.txt"
grep -v -e ': exit 0 ' -e '^total: ' "$out/summary.txt" >/dev/null && exit 1
exit 0

#!/usr/bin/env bash
# The GPU check, on a CUDA machine, from the repository root:
#   1. the unit tests (the exactness, greedy-equality and rollback tests also run on CUDA
#      there: tests/conftest.py DEVICES), and every notebook in float16 and in bfloat16
#      (the tiny pair on the GPU; nbval's lax mode: outputs differ from the committed
#      float32 CPU ones, so only errors and the notebooks' own asserts count). These three
#      jobs check correctness only, so they run side by side;
#   2. then, alone on the machine, the benchmark (`python -m specdec_ref.bench`) in
#      bfloat16: random-init models of the article's shapes (`--pair gpt2-shapes`: GPT-2
#      12 x 768 drafting for GPT-2 XL 48 x 1600, real vocabulary), with the fast path's
#      arms (static cache, CUDA graphs: `specdec_ref.fast`), compiled `generate` and the
#      fast path's costs against the bandwidth floor (report "fast_path"); then the tiny
#      pair (real alpha). `BENCH_PAIRS=gpt2xl` adds the older Llama run of GPT-2 XL's
#      shapes (`--random-shape gpt2-xl`: a 48 x 1600 target, its first 12 layers as draft).
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
# the H200 timings in specdec_ref/data/size-sweep-cuda.json (bf16, one 1-token eager pass:
# tiny target 5.1 ms, its draft 1.9 ms, 48 x 1600 target 30 ms, 12 x 768 8.1 ms). The
# gpt2-shapes run (first: it is what the fast path is for) has 2 modes x (13 arms at
# K = 1, 2, 4, among them compiled `generate` and assisted generation, + 10 fast arms at
# K = 1..8 and the model's K) x (1 warm-up + 2 repeats) of 32 tokens on one prompt; its
# random pair accepts almost nothing, so an eager arm at K costs about 32 (8.1 K + 30) ms:
# about 15 s per mode and round, 1.5 min, plus up to 1 min compiling `generate` and
# 20 s timing the passes; the tiny run 2 x 33 arms x (1 warm-up + 2 prompts) of 64 tokens,
# about 1 min. 6 prompts x 3 repeats of 128 tokens: about 10 min per tiny run.
# TINY_SIZE, SHAPES_SIZE and XL_SIZE override the sizes (extra arguments to the benchmark),
# SHAPES_PAIR the shapes (gpt2-shapes-small: tiny GPT-2 models, for a dry run on a CPU);
# BENCH_DTYPES (default "bfloat16") and BENCH_PAIRS ("gpt2shapes tiny"; also "gpt2xl")
# pick the runs.
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
SHAPES_SIZE=${SHAPES_SIZE:---k-values 1,2,4 --fast-k-values 1,2,3,4,5,6,7,8 --num-prompts 1 --repeats 2 --max-new-tokens 32 --prompt-tokens 32}
SHAPES_PAIR=${SHAPES_PAIR:-gpt2-shapes}
BENCH_DTYPES=${BENCH_DTYPES:-bfloat16}
BENCH_PAIRS=${BENCH_PAIRS:-gpt2shapes tiny}

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
            if [ "$pair" = gpt2shapes ]; then
                report=specdec_ref/data/bench-gpt2-shapes-cuda-$dtype.json
                # shellcheck disable=SC2086  # SHAPES_SIZE holds several arguments
                args=(--pair "$SHAPES_PAIR" --modes greedy,t1.0 --fast $SHAPES_SIZE)
                limit=240 needs=120
            elif [ "$pair" = tiny ]; then
                report=specdec_ref/data/bench-tiny-cuda-$dtype.json
                # shellcheck disable=SC2086  # TINY_SIZE holds several arguments
                args=(--pair tiny --modes greedy,t1.0 --k-values 2,3,4,5,6 --fast $TINY_SIZE)
                limit=150 needs=60
            elif [ "$pair" = gpt2xl ]; then
                report=specdec_ref/data/bench-gpt2xl-random-cuda-$dtype.json
                # shellcheck disable=SC2086
                args=(--pair random --random-shape gpt2-xl --modes greedy,t1.0 $XL_SIZE)
                limit=180 needs=90
            else
                summary "bench $pair: unknown pair in BENCH_PAIRS (gpt2shapes, tiny, gpt2xl)"
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

#!/usr/bin/env bash
# The GPU check: the unit tests, then every notebook in float16 and in bfloat16 on CUDA.
#
#   scripts/gpu_check.sh [OUTDIR]        # on a CUDA machine, from the repository root
#   scripts/gpu_check.sh --dry-run       # print what would run, run nothing
#
# The notebooks run with the tiny pair on the GPU (SPECDEC_DTYPE picks the dtype), under
# nbval's lax mode: outputs differ from the committed float32 CPU ones, so only errors
# and the notebooks' own asserts count, which is what a half-precision pair on Colab
# must pass. Logs and a summary go to OUTDIR (default gpu-check/). Needs pytest, nbval,
# ipykernel and ipywidgets; where the machine lacks them, put their wheels in .whl/.
set -u
cd "$(dirname "$0")/.."
run() { echo "+ $*"; [ "${DRY_RUN:-0}" = 1 ] || "$@"; }
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
out=${1:-gpu-check}
mkdir -p "$out"
if [ -d .whl ] && [ "${DRY_RUN:-0}" != 1 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
python3 - <<'PY' | tee "$out/versions.txt"
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
status=0
summary() { echo "$1: exit $2" | tee -a "$out/summary.txt"; [ "$2" = 0 ] || status=1; }
: > "$out/summary.txt"
run python3 -m pytest -q -p no:cacheprovider -n 8 tests >"$out/pytest.log" 2>&1
summary "unit tests" $?
for dtype in float16 bfloat16; do
    SPECDEC_DTYPE=$dtype run python3 -m pytest -q -p no:cacheprovider --nbval-lax \
        --nbval-current-env notebooks/ >"$out/nbval-$dtype.log" 2>&1
    summary "notebooks in $dtype on the GPU" $?
done
cat "$out/summary.txt"
exit $status

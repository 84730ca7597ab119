#!/usr/bin/env bash
# Every chapter as a Colab learner runs it, against two stand-ins of the article's pair.
#
#     scripts/nbval_colab.sh COLAB_VENV
#
# The notebooks' kernel is COLAB_VENV's Python (a kernelspec of its own, found through
# JUPYTER_PATH): it holds only what Colab preinstalls (constraints/colab.txt) and the
# package, installed here the way the chapters' set-up cell installs it (`pip install`,
# no book or dev extra), so an import of myst_nb, nbval or pytest in a chapter fails.
# pytest and nbval run from .venv and only drive that kernel.
#
# Two stand-in hubs (scripts/standin_hub.py), with GPT-2's real tokenizer, offline:
# "disagree" (two random models, alpha near 0) and "agree" (the target computes the
# draft's logits, alpha near 1). The two runs go side by side, one torch thread each.
# Exit 0 when both pass (or are skipped for want of the tokenizer files), else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
colab=${1:?usage: scripts/nbval_colab.sh COLAB_VENV}
kernel=specdec-colab

# The package as the set-up cell installs it: from its source, no extras. --no-deps
# keeps the libraries already there; the venv's .installed step installed them.
"$colab/bin/pip" install -q --no-deps --force-reinstall . || exit 1
"$colab/bin/python" -c "import specdec_ref" || exit 1
for module in myst_nb nbval pytest jupyter_book scipy; do
    if "$colab/bin/python" -c "import $module" 2>/dev/null; then
        echo "nbval-colab: $module is importable in $colab; it must not be" >&2; exit 1
    fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for stand in disagree agree; do
    flag=$([ "$stand" = agree ] && echo --agree || echo)
    .venv/bin/python scripts/standin_hub.py "$work/$stand" $flag
    status=$?
    if [ $status = 3 ]; then echo "nbval-colab: skipped (no GPT-2 tokenizer files)"; exit 0; fi
    [ $status = 0 ] || exit $status
done

run() {  # run STAND: every notebook with the "gpt2" pair of that stand-in hub
    HF_HOME="$work/$1" HF_HUB_OFFLINE=1 SPECDEC_PAIR=gpt2 SPECDEC_THREADS=1 OMP_WAIT_POLICY=PASSIVE \
        JUPYTER_PATH="$(cd "$colab" && pwd)/share/jupyter" \
        .venv/bin/python -m pytest -q -p no:cacheprovider --durations=5 --nbval-lax --nbval-kernel-name "$kernel" \
        notebooks/ >"$work/$1.log" 2>&1
}
run disagree & first=$!
run agree & second=$!
wait $first; disagree=$?
wait $second; agree=$?
for stand in disagree agree; do
    echo "== nbval-colab, the stand-in that ${stand}s:"
    # A passing run's slowest cells and summary; a failing run's whole log.
    if grep -qE "^(FAILED|ERROR)" "$work/$stand.log"; then cat "$work/$stand.log"
    else grep -A 6 "slowest" "$work/$stand.log"; tail -n 1 "$work/$stand.log"; fi
done
[ $disagree = 0 ] && [ $agree = 0 ]

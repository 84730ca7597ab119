# specdec_ref and its book. `make book` sets up and builds the book into _build/html;
# `make test` runs every check; `make demo` runs the demo.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_INDEX ?=
PIP_TORCH_FLAGS := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
# pytest-xdist workers for the unit tests (each test uses one torch thread).
PYTEST_WORKERS ?= -n 2
COLAB_VENV ?= .venv-colab

# $(call timed,name,command): run a command, print its wall time in seconds and add it
# to $(TIMES), which `make test` prints as one table at its end.
TIMES := .test-times
timed = start=$$(date +%s); $(2); status=$$?; took=$$(( $$(date +%s) - start )); \
	echo "time: $(1) $$took s"; echo "$(1) $$took" >> $(TIMES); exit $$status

.PHONY: setup demo bench bench-gpu execute check test test-floor lint clean book book-build static nbval nbval-half nbval-colab browser-check chromium

# A preinstalled torch (Colab, a CUDA machine) is kept: the venv then sees the system
# site-packages. Otherwise the CPU build pinned in constraints/cpu.txt is installed.
setup: $(VENV)/.installed $(COLAB_VENV)/.installed chromium

$(VENV)/.installed: pyproject.toml constraints/cpu.txt constraints/dev.txt
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "setup: using the preinstalled torch"; $(PY) -m venv --system-site-packages $(VENV); \
	else \
		$(PY) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip && \
		$(BIN)/pip install -q $(PIP_TORCH_FLAGS) -r constraints/cpu.txt; \
	fi
	$(BIN)/pip install -q -e ".[dev,book]" -c constraints/cpu.txt
	@touch $@

# The Colab-like environment of the notebooks' Colab pass (make nbval-colab): only what
# Colab preinstalls (constraints/colab.txt) and the package, no book or dev extra.
$(COLAB_VENV)/.installed: pyproject.toml constraints/colab.txt constraints/cpu.txt
	rm -rf $(COLAB_VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
		$(PY) -m venv --system-site-packages $(COLAB_VENV); \
	else \
		$(PY) -m venv $(COLAB_VENV) && $(COLAB_VENV)/bin/pip install -q --upgrade pip; \
	fi
	$(COLAB_VENV)/bin/pip install -q -r constraints/colab.txt -c constraints/cpu.txt
	$(COLAB_VENV)/bin/pip install -q . -c constraints/cpu.txt
	$(COLAB_VENV)/bin/python -m ipykernel install --sys-prefix --name specdec-colab \
		--display-name "Python (Colab-like)" >/dev/null
	@touch $@

demo: setup
	$(BIN)/python -m specdec_ref

# The fair benchmark against transformers (writes bench-results/bench-<pair>.json).
bench: setup
	$(BIN)/python -m specdec_ref.bench

# On a CUDA machine: the unit tests with their [cuda] cases, the notebooks in float16 and
# bfloat16, then the benchmark into specdec_ref/data/bench-*-cuda-*.json (logs in gpu-check/).
bench-gpu:
	scripts/gpu_check.sh

# Re-run every notebook top to bottom on the CPU with the tiny pair, outputs saved in place
# (one torch thread, as the chapters set; run on a quiet machine). See CONTRIBUTING.md.
execute: setup
	env -u SPECDEC_PAIR SPECDEC_THREADS=1 SPECDEC_DTYPE=float32 $(BIN)/jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb

# The quick tier, for contributors between edits: lint, then every unit test not marked
# slow (the exact laws by enumeration, greedy equality on every path, the caches, the
# messages). The slow ones, the statistical end-to-end checks of sampling, the audits'
# power and the bfloat16 model at GPT-2 XL's width, run in `make test`, which CI runs.
check: setup
	@$(BIN)/ruff check specdec_ref tests scripts book/_ext
	@start=$$(date +%s); $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS) -m "not slow"; \
		status=$$?; echo "make check: $$(( $$(date +%s) - start )) s of unit tests"; exit $$status

# Lint, unit tests, then every notebook in its three passes (scripts/notebook_passes.py:
# outputs against a fresh run at another thread count than the one that wrote them, the
# asserts in bfloat16, and twice as a Colab learner runs them with the article's pair
# stood in), two notebooks at a time; the book with warnings as errors, and every built
# page in a real browser. It ends with one table of its steps' wall times.
test: setup static
	@rm -f $(TIMES)
	@$(call timed,ruff,$(BIN)/ruff check specdec_ref tests scripts book/_ext)
	@$(call timed,pytest,$(BIN)/python -m pytest -q --durations=12 $(PYTEST_WORKERS))
	@$(call timed,notebooks,$(BIN)/python scripts/notebook_passes.py --colab-venv $(COLAB_VENV) --times $(TIMES))
	@$(call timed,book,$(MAKE) --no-print-directory book-build)
	@$(call timed,browser,$(BIN)/python scripts/browser_check.py)
	@echo "make test, wall time per step (a pass's line: its notebooks' seconds, run two at a time):"; \
	awk '$$3 == "" {printf "  %-16s %5d s\n", $$1, $$2; total += $$2} \
		$$3 != "" {printf "    %-14s %5d s of notebooks\n", $$1, $$2} \
		END {printf "  %-16s %5d s\n", "total", total}' $(TIMES)

# The book: MathJax and the widget manager are copied into it (offline reading). The
# old pages go first, so that no page of a removed chapter lingers in _build/html.
book: setup static book-build
	@echo "book: open _build/html/index.html"

book-build:
	rm -rf _build/html
	$(BIN)/jupyter-book build --all -W -n --keep-going .

# MathJax, RequireJS and the ipywidgets manager from the npm registry into _static_offline/
# (not committed); without npm the book loads them from their CDNs.
static:
	@$(PY) scripts/fetch_static_assets.py

# One pass of the notebooks alone (scripts/notebook_passes.py says what each checks).
# nbval: every stored output against a fresh float32 run at two torch threads (tag
# nbval-ignore-output on cells whose output legitimately varies, such as timings).
nbval: setup
	$(BIN)/python scripts/notebook_passes.py --passes nbval

# nbval-half: the tiny pair in bfloat16; only errors and the notebooks' asserts count.
nbval-half: setup
	$(BIN)/python scripts/notebook_passes.py --passes half

# nbval-colab: as a Colab learner runs them. The kernel's environment (COLAB_VENV, built
# by `make setup`) holds only what Colab preinstalls and the package as the set-up cell
# installs it (no book or dev extra); the article's pair (SPECDEC_PAIR=gpt2) comes from
# two stand-in hub caches, offline: small random GPT-2-family models under the names
# "gpt2" and "gpt2-xl" with GPT-2's real tokenizer, one pair that disagrees (alpha near
# 0) and one that agrees (alpha near 1). Skipped, with a note, where the tokenizer files
# cannot be fetched (no npm).
nbval-colab: setup
	$(BIN)/python scripts/notebook_passes.py --passes colab --colab-venv $(COLAB_VENV)

# The unit tests against the oldest releases pyproject.toml allows (transformers 4.56):
# A second virtual environment, built from the pins in constraints/floor.txt (the
# oldest transformers, tokenizers, huggingface-hub, safetensors, numpy and tqdm that
# pyproject.toml allows, with the CPU torch of constraints/cpu.txt), then `pytest` in
# it: the proof that the floors in pyproject.toml are true. Not part of `make test`.
FLOOR_VENV ?= .venv-floor
FLOOR_BIN := $(FLOOR_VENV)/bin

$(FLOOR_VENV)/.installed: pyproject.toml constraints/floor.txt constraints/cpu.txt
	rm -rf $(FLOOR_VENV)
	$(PY) -m venv $(FLOOR_VENV)
	$(FLOOR_BIN)/pip install -q --upgrade pip
	$(FLOOR_BIN)/pip install -q $(PIP_TORCH_FLAGS) -r constraints/cpu.txt
	$(FLOOR_BIN)/pip install -q -e ".[dev,book]" -c constraints/floor.txt
	$(FLOOR_BIN)/pip check
	@touch $@

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_BIN)/python -c "import transformers as t; print('test-floor: transformers', t.__version__)"
	$(FLOOR_BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS)

browser-check: setup
	$(BIN)/python scripts/browser_check.py

# Headless Chromium for the browser check: installed with apt where that is possible
# (as root, or with password-less sudo); elsewhere the check says it is skipped.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
		|| command -v google-chrome >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo -n); echo "setup: installing chromium for the browser check"; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
		|| { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
		|| echo "setup: chromium could not be installed; the browser check will be skipped"; \
	else echo "setup: no chromium and no apt-get; the browser check will be skipped"; fi

lint: setup
	$(BIN)/ruff check specdec_ref tests scripts book/_ext

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(COLAB_VENV) _build .pytest_cache _static_offline .standin

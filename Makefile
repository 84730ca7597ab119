# specdec_ref and its book. `make book` sets up and builds the book into _build/html;
# `make test` runs every check; `make demo` runs the demo.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_INDEX ?=
PIP_TORCH_FLAGS := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: setup demo bench execute test lint clean book static nbval browser-check chromium

# A preinstalled torch (Colab, a CUDA machine) is kept: the venv then sees the system
# site-packages. Otherwise the CPU build pinned in constraints/cpu.txt is installed.
setup: $(VENV)/.installed chromium

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "setup: using the preinstalled torch"; $(PY) -m venv --system-site-packages $(VENV); \
	else \
		$(PY) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip && \
		$(BIN)/pip install -q $(PIP_TORCH_FLAGS) -r constraints/cpu.txt; \
	fi
	$(BIN)/pip install -q -e ".[dev,book]" -c constraints/cpu.txt
	@touch $@

demo: setup
	$(BIN)/python -m specdec_ref

# The fair benchmark against transformers (writes bench-results/bench-<pair>.json).
bench: setup
	$(BIN)/python -m specdec_ref.bench

# Re-run every notebook top to bottom on the CPU with the tiny pair, outputs saved in place
# (one torch thread, as the chapters set; run on a quiet machine).
execute: setup
	SPECDEC_PAIR=tiny $(BIN)/jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb

# Lint, unit tests, notebook outputs against a fresh run, the book with warnings as
# errors, and every built page in a real browser.
test: setup static
	$(BIN)/ruff check specdec_ref tests scripts book/_ext
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory nbval
	rm -rf _build/html
	$(BIN)/jupyter-book build --all -W -n --keep-going .
	$(BIN)/python scripts/browser_check.py

# The book: MathJax and the widget manager are copied into it (offline reading). The
# old pages go first, so that no page of a removed chapter lingers in _build/html.
book: setup static
	rm -rf _build/html
	$(BIN)/jupyter-book build --all -W -n --keep-going .
	@echo "book: open _build/html/index.html"

# MathJax, RequireJS and the ipywidgets manager from the npm registry into _static_offline/
# (not committed); without npm the book loads them from their CDNs.
static:
	@$(PY) scripts/fetch_static_assets.py

# Every notebook re-run top to bottom; each stored output must match (tag
# nbval-ignore-output on cells whose output legitimately varies, such as timings).
nbval: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg notebooks/

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
	rm -rf $(VENV) _build .pytest_cache _static_offline

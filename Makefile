# specdec_ref and its book. `make demo` sets up and runs the demo; `make test` runs every check.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_INDEX ?=
PIP_TORCH_FLAGS := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: setup demo test lint clean

# A preinstalled torch (Colab, a CUDA machine) is kept: the venv then sees the system
# site-packages. Otherwise the CPU build pinned in constraints/cpu.txt is installed.
setup: $(VENV)/.installed

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

test: setup
	$(BIN)/ruff check specdec_ref tests
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check specdec_ref tests

clean:
	rm -rf $(VENV) _build .pytest_cache

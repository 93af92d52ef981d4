# The two commands a newcomer needs: `make test` and `make reproduce` (see README.md).
# Every target builds its own virtual environment in .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned, so nothing can pull a multi-GB CUDA build instead of the CPU wheel.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check diversed tests benchmarks
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check diversed tests benchmarks
	$(BIN)/ruff format --check diversed tests benchmarks

bench: $(STAMP)
	mkdir -p benchmarks/results
	$(BIN)/diversed bench --out benchmarks/results/bench-tiny.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

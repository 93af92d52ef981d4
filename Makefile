# The two commands a newcomer needs: `make reproduce` and `make test` (see README.md).
# Both build their own virtual environment in .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Jobs of the workflow call `diversed` and `snakemake` from the venv.
export PATH := $(abspath $(BIN)):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
# Local dataset copies: $DIVERSED_DATA_DIR if set, else a shared/data folder beside the checkout if there is one.
DIVERSED_DATA_DIR ?= $(firstword $(wildcard $(abspath ../shared/data)))
export DIVERSED_DATA_DIR

.PHONY: test reproduce models lint bench clean

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

models: $(STAMP)
	$(BIN)/diversed models fetch

reproduce: models
	$(BIN)/snakemake
	$(BIN)/snakemake --report results/report.html
	@echo
	@echo "tables:  results/tables/main.md (.csv, .tex)"
	@echo "plots:   results/plots/"
	@echo "report:  results/report.html"
	@echo "mlflow:  $(BIN)/mlflow ui --backend-store-uri sqlite:///results/mlflow/mlruns.db"

lint: $(STAMP)
	$(BIN)/ruff check diversed tests benchmarks
	$(BIN)/ruff format --check diversed tests benchmarks

bench: $(STAMP)
	mkdir -p benchmarks/results
	$(BIN)/diversed bench --out benchmarks/results/bench-tiny.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .snakemake

# The two commands a newcomer needs: `make reproduce` and `make test` (see README.md).
# Both build their own virtual environment in .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints/cpu.txt
# One stamp per constraints file, so `make CONSTRAINTS=/dev/null test` in a venv that `make` built
# with the CPU wheel really installs again (the file /dev/null is never newer than a stamp).
STAMP := $(VENV)/.installed-$(notdir $(CONSTRAINTS))
# Jobs of the workflow call `diversed` and `snakemake` from the venv.
export PATH := $(abspath $(BIN)):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
# Local dataset copies: $DIVERSED_DATA_DIR if set, else a shared/data folder beside the checkout if there is one.
DIVERSED_DATA_DIR ?= $(firstword $(wildcard $(abspath ../shared/data)))
export DIVERSED_DATA_DIR

.PHONY: test test-compat test-slurm reproduce study models lint bench bench-qwen bench-qwen-fp16 clean

# A GPU machine (a cluster's login node, a CUDA box): keep the CUDA torch, not the CPU wheel:
#   make CONSTRAINTS=/dev/null test        # pip then installs PyPI's torch, a CUDA 12 build
# or, with a torch of your own (a site module, another CUDA version): pip install -e ".[dev,slurm]".
# `diversed doctor` then says which device and dtype the jobs will use.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	rm -f $(VENV)/.installed*
	$(BIN)/pip install --quiet --upgrade pip
	# Other constraints than the CPU wheel's replace a CPU build of torch: pip would keep it (it
	# satisfies a bare `torch`), and every GPU job would then stop on a GPU node (--device cuda).
	if [ "$(CONSTRAINTS)" != constraints/cpu.txt ] && $(BIN)/python -c \
		"import sys, torch; sys.exit(torch.version.cuda is not None)" 2>/dev/null; then \
		$(BIN)/pip uninstall --quiet -y torch; fi
	# torch first, pinned by the constraints file, so nothing can pull a multi-GB CUDA build instead
	# of the CPU wheel on a CPU machine.
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) torch
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check diversed tests benchmarks
	$(BIN)/snakemake --lint --quiet all
	$(BIN)/python -m pytest

# The engine's tests on the other releases pyproject.toml allows; `make test` runs the pinned ones.
# transformers: the oldest (5.14.0) and the one a GPU image ships (5.17.0); 5.0-5.12 fail at import
# beside the `kernels` package newer releases require. torch: the floor (2.6.0, the oldest that
# transformers 5 turns on) and the newest release. PyPI's Linux torch wheels are CUDA builds (with
# their nvidia libraries, ~3 GB a release): they run these tests on the CPU all the same; the
# machine's pip cap on torch (/etc/xdg/pip) is lifted for them. Each release is installed under
# .compat/ and put first on the path, so the venv stays as it is.
COMPAT_VERSIONS ?= 5.14.0 5.17.0
COMPAT_TORCH ?= 2.6.0 2.15.0
COMPAT_TESTS := tests/test_greedy_identity.py tests/test_batched.py tests/test_prefix.py \
	tests/test_sampling_exactness.py tests/test_cache_and_head.py tests/test_control.py tests/test_kv.py \
	tests/test_devices.py
COMPAT_PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider $(COMPAT_TESTS)
test-compat: $(STAMP)
	@for v in $(COMPAT_VERSIONS); do \
		test -d .compat/transformers-$$v || $(BIN)/pip install --quiet --target .compat/transformers-$$v \
			transformers==$$v "huggingface-hub<2" 2>&1 | grep -v "dependency resolver\|requires packaging\|WARNING: Location"; \
		PYTHONPATH=$(abspath .compat)/transformers-$$v $(BIN)/python -c \
			"import transformers; print('transformers', transformers.__version__)" || exit 1; \
		PYTHONPATH=$(abspath .compat)/transformers-$$v $(COMPAT_PYTEST) || exit 1; \
	done
	@for v in $(COMPAT_TORCH); do \
		test -d .compat/torch-$$v || PIP_CONSTRAINT=/dev/null $(BIN)/pip install --quiet \
			--target .compat/torch-$$v torch==$$v 2>&1 | grep -v "dependency resolver\|WARNING: Location"; \
		PYTHONPATH=$(abspath .compat)/torch-$$v $(BIN)/python -c \
			"import torch; print('torch', torch.__version__)" || exit 1; \
		PYTHONPATH=$(abspath .compat)/torch-$$v $(COMPAT_PYTEST) || exit 1; \
	done

# The cluster path on a real one-node SLURM (root: installs slurm-wlm/munge; else skips saying why).
test-slurm: $(STAMP)
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e ".[slurm]"
	tests/slurm/run.sh

models: $(STAMP)
	$(BIN)/diversed models fetch

reproduce: models
	$(BIN)/snakemake
	$(BIN)/snakemake --report results/report.html
	@echo
	@cat results/tables/weights.md
	@echo
	@echo "tables:  results/tables/main.md (.csv, .tex); the verdict against the static frontier: frontier.md; the heads' w on test tokens: weights.md"
	@echo "plots:   results/plots/"
	@echo "report:  results/report.html"
	@echo "mlflow:  $(BIN)/mlflow ui --backend-store-uri sqlite:///results/mlflow/mlruns.db"

# The CPU study (config/cpu-study.yaml): hours on 2 cores, resumable; results in runs/cpu-study/.
# A study through the workflow: `make study CONFIG=config/natural.yaml` decodes, scores and reports
# every cell of that config in runs/natural/ (resumable; a cell whose n_examples grows decodes only
# its new examples); commit the score files you keep (docs/results/<study>/cells/).
CONFIG ?= config/cpu-study.yaml
STUDY_DIR ?= runs/$(basename $(notdir $(CONFIG)))
study: models
	$(BIN)/snakemake --configfile $(CONFIG) --directory $(STUDY_DIR)
	$(BIN)/snakemake --configfile $(CONFIG) --directory $(STUDY_DIR) --report results/report.html

lint: $(STAMP)
	$(BIN)/ruff check diversed tests benchmarks
	$(BIN)/ruff format --check diversed tests benchmarks

bench: $(STAMP)
	mkdir -p benchmarks/results
	$(BIN)/diversed bench --batch-sizes 1 2 4 8 --out benchmarks/results/bench-tiny.json

# The embedded pair, greedy, k = 4, HumanEval prompts, in the dtype --dtype auto picks here (about an
# hour on 2 cores; see benchmarks/README.md).
BENCH_QWEN_OUT ?= benchmarks/results/bench-qwen-batched.json
bench-qwen: models
	$(BIN)/diversed bench --target embedded:qwen2.5-coder-1.5b --draft embedded:qwen2.5-coder-0.5b \
		--dataset humaneval --n-prompts 8 --max-new-tokens 128 --num-assistant-tokens 4 \
		--batch-sizes 1 2 4 8 --repeats 3 --out $(BENCH_QWEN_OUT)

# The same with fp16 weights (--quantize fp16, diversed/backends/cpu/quantize.py), batch sizes 1 and 4.
bench-qwen-fp16: models
	$(BIN)/diversed bench --target embedded:qwen2.5-coder-1.5b --draft embedded:qwen2.5-coder-0.5b \
		--quantize fp16 --dataset humaneval --n-prompts 4 --max-new-tokens 128 --num-assistant-tokens 4 \
		--batch-sizes 1 4 --repeats 3 --out benchmarks/results/bench-qwen-fp16.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .snakemake .compat

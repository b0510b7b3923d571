# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-slow test-all lint bench clean

# The stamp is newer than pyproject.toml when the venv is current: no reinstall.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# This torch release is a CPU build on this machine's disk; anything else pulls GBs.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/plasticlm demo

test: $(STAMP)
	$(BIN)/python -m pytest

# the inner loop (under a minute on 2 cores): the package's shape, the delta-rule ops against
# their reference, configs and registries' refusals, the light CLI, the docs' links, exports
FAST := tests/test_structure.py tests/memory/test_memory_ops.py tests/eval/test_eval_prompts.py \
	tests/data/test_data_partition.py tests/fednl/test_fednl_config.py tests/scol/test_scol_config.py \
	tests/refine/test_refine_config.py tests/test_cli_light.py tests/test_docs.py tests/memory/test_memory_export.py \
	tests/experiments/test_experiment_rows.py
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(FAST)

# the tests marked slow (over 30 s each, the bench smoke runs, larger shapes), left out of `make test`
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

test-all: test test-slow

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

bench: $(STAMP)
	@echo "benchmarks: see bench/README.md"

clean:
	rm -rf $(VENV) build *.egg-info

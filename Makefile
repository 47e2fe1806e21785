# flowy developer commands. Every target bootstraps what it needs: uv (via pip) and the
# locked workspace environment (.venv, from uv.lock).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
UV := $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
RUN := $(UV) run --frozen --all-packages
PYTEST_ARGS ?=

.PHONY: setup test test-core lint format typecheck demo bench verify-stress clean

setup:
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet "uv>=0.5"
	$(UV) sync --all-packages --frozen

test: setup
	$(RUN) pytest $(PYTEST_ARGS)

test-core: setup
	$(RUN) pytest packages/flowy-core/tests tests $(PYTEST_ARGS)

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

format: setup
	$(RUN) ruff check --fix .
	$(RUN) ruff format .

typecheck: setup
	$(RUN) pyright

demo: setup
	$(RUN) flowy demo $(DEMO_ARGS)

bench: setup
	$(RUN) python bench/run.py $(BENCH_ARGS)

STRESS_TESTS = packages/flowy-core/tests/test_handoff.py packages/flowy-core/tests/test_streams.py \
	packages/flowy-core/tests/test_leases_runner.py packages/flowy-core/tests/test_worker.py \
	packages/flowy-core/tests/test_runner.py packages/flowy-core/tests/test_conformance_memory.py
STRESS_COUNT ?= 20

# The hand-off/resume/orphan/lease/stream contract tests, STRESS_COUNT times in a row, then
# a randomised run of thousands of hand-offs with faults at every phase.
verify-stress: setup
	@for i in $$(seq 1 $(STRESS_COUNT)); do \
		echo "verify-stress: round $$i/$(STRESS_COUNT)"; \
		$(RUN) pytest -q -p no:cacheprovider $(STRESS_TESTS) $(PYTEST_ARGS) | tail -n 1 || exit 1; \
	done
	$(RUN) python -m flowy.testing.stress --handoffs 5000 $(STRESS_ARGS)
	$(RUN) python -m flowy.testing.stress --handoffs 2000 --seed 7 --fault-rate 0.3 $(STRESS_ARGS)

clean:
	rm -rf .venv .pytest_cache .ruff_cache

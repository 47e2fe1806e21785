# flowy developer commands. Every target bootstraps what it needs: uv, then an environment
# (.venv) synced from uv.lock. uv is the one on PATH if it runs; otherwise a private copy in
# .tools/uv-venv, a venv of its own made with `python3 -m venv` and filled by that venv's pip,
# so no system Python is ever modified (PEP 668 / EXTERNALLY-MANAGED is respected).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
UV_VENV := .tools/uv-venv
UV := $(or $(shell uv --version >/dev/null 2>&1 && command -v uv),$(UV_VENV)/bin/uv)
RUN := $(UV) run --frozen --all-packages
PYTEST_ARGS ?=
DEMO_ARGS ?=
DEMO_DB ?= .flowy-demo/demo.db

.PHONY: setup test test-core lint format typecheck docs demo bench verify-stress clean uv

# Only built when uv is not on PATH (otherwise $(UV) names the existing uv).
$(UV_VENV)/bin/uv:
	@echo "uv is not on PATH: installing it into $(UV_VENV) (a private venv; the system Python is left alone)"
	@$(PYTHON) -m venv --clear $(UV_VENV) || { \
		echo "error: '$(PYTHON) -m venv' failed. On Debian or Ubuntu: sudo apt install python3-venv;" \
			"or install uv yourself: https://docs.astral.sh/uv/getting-started/installation/" >&2; \
		exit 1; }
	$(UV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "uv>=0.5"

uv: $(UV)
	@:

# The whole workspace and its dev tools (pytest, ruff, pyright, moto, ...): what the other
# targets run in.
setup: $(UV)
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

# docs/api.md from the docstrings (tests/test_api_docs.py fails when it is stale).
docs: setup
	$(RUN) python scripts/api_reference.py

# flowy-core alone (no dependencies) into .venv. --inexact: a dev environment already in
# .venv (make setup/test) keeps its packages; `make test` later adds them if missing.
demo:
	@echo "make demo: the refund-agent demo on flowy-core alone (no dependencies; .venv stays under 1 MB)."
	@echo "  First run from a fresh clone: about 10 s, half of it installing uv into .tools/uv-venv (63 MB)"
	@echo "  when uv is not on PATH (about 6 s when it is). Later runs: about 5 s."
	@$(MAKE) --no-print-directory uv
	$(UV) sync --package flowy-core --no-dev --frozen --inexact
	.venv/bin/flowy demo --db $(DEMO_DB) $(DEMO_ARGS)
	@echo
	@echo "The flowy command is in .venv/bin (not on your PATH). From the repository root, run:"
	@echo "  .venv/bin/flowy threads --db $(DEMO_DB)"
	@echo "or first activate the environment (. .venv/bin/activate) and type the flowy commands above as printed."

# One table of flowy's figures against their baselines and budgets (bench/README.md).
# BENCH_ARGS: --quick, --full, --only NAME, --json FILE, --strict. Not part of `make test`.
bench: setup
	$(RUN) python bench/run.py $(BENCH_ARGS)

STRESS_TESTS = packages/flowy-core/tests/test_handoff.py packages/flowy-core/tests/test_streams.py \
	packages/flowy-core/tests/test_leases_runner.py packages/flowy-core/tests/test_worker.py \
	packages/flowy-core/tests/test_runner.py packages/flowy-core/tests/test_conformance_memory.py
STRESS_COUNT ?= 20
STRESS_STORES ?= sqlite,postgres,redis,dynamodb
STRESS_HANDOFFS ?= 10000
STRESS_DYNAMODB_HANDOFFS ?= 300
STRESS_OUTAGE_HANDOFFS ?= 2000

# The hand-off/resume/orphan/lease/stream contract tests, STRESS_COUNT times in a row; a
# randomised in-process run of thousands of hand-offs with faults at every phase; then,
# on every store of STRESS_STORES, STRESS_HANDOFFS hand-offs through worker processes with
# faults at every phase and workers SIGKILLed mid-segment (one summary line per store).
# DynamoDB runs on moto here, which serves about ten saves a second: fewer hand-offs.
# Last, STRESS_OUTAGE_HANDOFFS hand-offs drained by a worker process while PostgreSQL and
# Redis go away three times (every connection cut through a proxy).
verify-stress: setup
	@for i in $$(seq 1 $(STRESS_COUNT)); do \
		echo "verify-stress: round $$i/$(STRESS_COUNT)"; \
		$(RUN) pytest -q -p no:cacheprovider $(STRESS_TESTS) $(PYTEST_ARGS) | tail -n 1 || exit 1; \
	done
	$(RUN) python -m flowy.testing.stress --handoffs 5000 $(STRESS_ARGS)
	$(RUN) python -m flowy.testing.stress --handoffs 2000 --seed 7 --fault-rate 0.3 $(STRESS_ARGS)
	$(RUN) python scripts/stress_stores.py --stores $(STRESS_STORES) \
		--handoffs $(STRESS_HANDOFFS) --dynamodb-handoffs $(STRESS_DYNAMODB_HANDOFFS)
	FLOWY_OUTAGE_HANDOFFS=$(STRESS_OUTAGE_HANDOFFS) FLOWY_OUTAGES=3 \
		$(RUN) pytest -q -p no:cacheprovider tests/test_store_outage.py $(PYTEST_ARGS)

clean:
	rm -rf .venv .tools .pytest_cache .ruff_cache

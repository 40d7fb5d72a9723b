# Two commands on a fresh machine with Python 3.11: `make demo` and `make test`.
# Each creates .venv and installs what it needs (pip: torch==2.13.0 is a CPU wheel).

PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test check lint bench broker redis clean help

help:
	@echo "make demo   - install and run the collaborative-inference demo on real MNIST digits"
	@echo "make test   - install dev deps, make sure an MQTT broker runs, run ruff, mypy and the suite"
	@echo "make bench  - run the benchmarks (bench/) and regenerate BENCHMARKS.md"

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.demo-installed: pyproject.toml | $(PY)
	$(PIP) install -e '.[hub,cli]'
	@touch $@

$(VENV)/.dev-installed: pyproject.toml | $(PY)
	$(PIP) install -e '.[dev]'
	@touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(BIN)/tandem demo $(DEMO_ARGS)

# Tests start their own Mosquitto on free ports and need its binary; a few also use
# the machine's broker on 127.0.0.1:1883, which this starts when it is not running.
broker:
	@bash scripts/ensure-broker

# The rate-limit tests share buckets through Redis on 127.0.0.1:6379; this starts it
# (or installs it with apt-get) when nothing listens there.
redis:
	@bash scripts/ensure-redis

# The registry tests run on PostgreSQL too (and the kill -9 leader failover needs it): this
# starts it on 127.0.0.1:5432 (or installs it with apt-get) when nothing listens there.
.PHONY: postgres chromium
postgres:
	@bash scripts/ensure-postgres

# The fleet console's tests drive Debian's headless Chromium: installed here, not at test time.
chromium:
	@bash scripts/ensure-chromium

# The whole check, as CI runs it: ruff, mypy, then pytest (PYTEST_ARGS go to pytest).
# Under CI=true a test whose PostgreSQL, Redis or browser is missing fails instead of skipping.
test: $(VENV)/.dev-installed broker redis postgres chromium
	VENV=$(VENV) bash scripts/check $(PYTEST_ARGS)

check: test

# Every benchmark part (about half an hour on 2 cores); one part: make bench BENCH_ARGS=round-trip
bench: $(VENV)/.dev-installed broker
	@bash scripts/ensure-nginx
	$(PY) -m bench $(BENCH_ARGS)

# The gRPC API's Python modules, from cloud_hub/grpc/inference.proto (needs grpcio-tools, in dev).
.PHONY: grpc
grpc: $(VENV)/.dev-installed
	$(PY) scripts/generate-grpc

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

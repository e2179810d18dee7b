# Kairos developer entry points. On a fresh clone `make run` starts the local stack and `make test` runs
# the checks: each installs into .venv first when .venv is missing or older than pyproject.toml.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# Made after a successful install; a target that needs .venv depends on it, so an installed tree starts
# at once and a changed pyproject.toml installs again.
INSTALLED := $(VENV)/.installed

# The conformance corpus (KAI v0.17's tests): the shared folder next to the repository when present, else
# the in-repo copy of it.
CONFORMANCE_ROOT := $(if $(wildcard ../shared/conformance/kai-v0.17/cases),../shared/conformance/kai-v0.17,tests/conformance/kai)
CONFORMANCE_CASES := $(addprefix $(CONFORMANCE_ROOT)/,cases actions actions-config)

.PHONY: install lint test test-bus run demo conformance bench-core bench-tracing bench bench-quick chaos soak fmt

install:
	@rm -f $(INSTALLED)
	@$(MAKE) --no-print-directory $(INSTALLED)

$(INSTALLED): pyproject.toml
	@sh tools/prerequisites.sh "$(PYTHON)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -e '.[dev]'
	@touch $@

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite runs in TEST_WORKERS processes (pytest-xdist). Most tests wait on a nats-server, kubesim or the
# services they start, so two workers on CI's two cores take less time than one. A worker that runs out of
# tests takes some from the other's queue (worksteal): with xdist's default, the tests left at the end sat
# in one worker's queue while the other idled. TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal

test-bus: $(INSTALLED)
	KAIROS_BUS_CORPUS=all $(BIN)/pytest tests/e2e/test_conformance_bus.py

run: $(INSTALLED)
	$(BIN)/kairos up

demo: $(INSTALLED)
	$(BIN)/kairos demo

conformance: $(INSTALLED)
	$(BIN)/kairos conformance check $(CONFORMANCE_CASES)

bench-core: $(INSTALLED)
	$(BIN)/python -m tools.bench.core

bench-tracing: $(INSTALLED)
	$(BIN)/python -m tools.bench.tracing_overhead

# The benchmark suite (issue 6): every workload in-process and over NATS, scaling curves, memory target.
bench: $(INSTALLED) bench-core bench-tracing
	$(BIN)/kairos bench --json bench-full.json --plot bench-full.png

bench-quick: $(INSTALLED)
	$(BIN)/kairos bench --quick --json bench-quick.json --plot bench-quick.png

# The chaos suite (issue 7): 5,000 pods, 2 replicas of every service, kills, a NATS restart, API faults.
chaos: $(INSTALLED)
	$(BIN)/kairos chaos --json chaos-full.json

# The soak (issue 18): 30 minutes of jobs arriving and finishing, every fault once, memory per service.
soak: $(INSTALLED)
	$(BIN)/kairos chaos --soak 30 --json soak.json

fmt: $(INSTALLED)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

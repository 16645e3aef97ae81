# The two commands of the quickstart are `make demo` and `make test`; both create .venv and
# install everything from this repository's own files (pyproject.toml, package-lock.json) first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test test-slow test-all lint typecheck contracts bench-gas bench-sim bench-engine bench-devnet clean

install: $(STAMP)

$(STAMP): pyproject.toml package.json package-lock.json $(wildcard gwtf/api/dashboard/*)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	npm ci --no-audit --no-fund --silent  # its postinstall builds the dashboard into gwtf/api/static
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gwtf-node demo

# Two workers (pytest-xdist), a test file each at a time: many tests wait on clocks and sockets,
# and a file's tests share its module fixtures (a chain, a bed of namespaces).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# Only the `slow` tests: the long live swarms of OS processes and the deep stateful run.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "slow or not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy gwtf

# Recompile the Solidity sources into gwtf/contracts/artifacts.json (solc-js, evmVersion prague).
contracts: $(STAMP)
	node gwtf/contracts/compile.js

bench-gas: $(STAMP)
	$(BIN)/python bench/gas.py

bench-sim: $(STAMP)
	$(BIN)/python bench/sim_compare.py

bench-engine: $(STAMP)
	$(BIN)/python bench/engine.py

bench-devnet: $(STAMP)
	$(BIN)/python bench/devnet_setup.py

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache

# Two commands on a fresh machine: `make reproduce` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
PREFECT_PORT ?= 4200

.PHONY: install reproduce system-packages test test-all lint bench mutation clean-outputs

# (Re)install when pyproject.toml changes. torch==2.13.0 resolves to the CPU build on this
# project's machines; on a GPU machine install the CUDA build of the same version first.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Full reproduction at the params.yaml profile (cpu by default), cached and resumable by DVC.
reproduce: install
	REPRO_PREFECT_PORT=$(PREFECT_PORT) repro server start
	PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api dvc repro
	@echo
	repro diff HEAD
	@echo
	@echo "Report:     $(CURDIR)/reports/index.md  (with figures: reports/index.html)"
	@echo "Prefect UI: http://127.0.0.1:$(PREFECT_PORT)  (server left running; 'repro server stop' stops it)"
	@echo "MLflow UI:  run 'repro ui', then open http://127.0.0.1:5000"

## PostgreSQL and Chromium for the server and browser tests (root; skipped tests otherwise).
system-packages:
	bash .ci/system-packages.sh

## Default test suite (excludes slow, gpu and network markers).
test: install
	pytest -q

test-all: install
	pytest -q -m "not gpu and not network"

lint: install
	ruff check .

bench: install
	python bench/run_all.py

## Mutation testing of tasks/<slug>/method.py against tests/unit/test_<slug>_*.py (slow; not in `test`).
## `make mutation SLUG=coda` one paper, `make mutation` every paper in params.yaml; RETRY=1 re-tests
## only the last run's undetected mutants (listed equivalents included); SAMPLE=N a seeded sample of N mutants; FUNCTIONS='f g*' only those
## functions; TESTS='method exact' only those test files; MUTATION_JOBS=N mutants in parallel (default 2).
## See docs/testing.md.
mutation:
	@python -c "import mutmut" 2>/dev/null || { echo "mutmut missing: $(BIN)/pip install 'mutmut>=3.8,<4' (or make install)"; exit 1; }
	python tools/mutation.py $(SLUG) $(if $(RETRY),--retry) $(if $(SAMPLE),--sample $(SAMPLE)) $(if $(FUNCTIONS),--functions $(FUNCTIONS)) $(if $(TESTS),--tests $(TESTS))

clean-outputs:
	rm -rf data models reports/*/figures reports/*/plots mlflow.db mlartifacts .prefect .mutation

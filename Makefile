# Two commands do all the set-up on a fresh machine:
#   make run    create .venv if needed, install crosslip, run the default workflow
#   make test   the same set-up, then the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.crosslip-installed
CORES ?= all

.PHONY: run test lint bench record clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --rerun-incomplete

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_pipeline.py

# docs/reproduction.md from the runs committed under docs/reproduction/ (docs/reproduction-record.md)
record: $(STAMP)
	$(BIN)/python -m crosslip.reproduction render

clean:
	rm -rf results .snakemake

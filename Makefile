# Two commands do all the set-up on a fresh machine:
#   make run    create .venv if needed, install crosslip, run the default workflow
#   make test   the same set-up, then the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.crosslip-installed
CORES ?= all
ARGS ?=
# pytest-xdist: a worker per core; the tests of one shared workflow run stay on one worker
# (tests/conftest.py). XDIST= runs the tests in one process.
XDIST ?= -n auto --dist loadgroup

.PHONY: run test test-fast lint format bench record clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

# A killed run resumes with the same command (docs/troubleshooting-resume.md). ARGS: more
# Snakemake arguments, e.g. make run ARGS="--configfile config/presets/mnist.yaml". The jobs
# fork from a job server that has imported torch once (crosslip.forkserver).
run: $(STAMP)
	$(BIN)/python -m crosslip.forkserver -- $(BIN)/snakemake --cores $(CORES) --rerun-incomplete $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST)

# the quick tier for the edit loop: everything but the Snakemake end-to-end tests
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile workflow
	$(BIN)/snakemake --lint

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/snakefmt Snakefile workflow

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_pipeline.py

# docs/reproduction.md from the runs committed under docs/reproduction/ (docs/reproduction-record.md)
record: $(STAMP)
	$(BIN)/python -m crosslip.reproduction render

clean:
	rm -rf results .snakemake

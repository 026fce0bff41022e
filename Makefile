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

# The installation takes about two thirds of the time of the plain two `pip install`s
# (x0.63 measured on a 2-core machine): pip 25.1 and later choose among an index's files 3x faster
# than the pip a new venv brings (nothing is fetched where the venv's pip already
# satisfies it), and the installed modules are byte-compiled in a process per core instead
# of one file after another inside pip. Not compiled: the packages' own test suites
# (`tests/` and `test/` folders, a third of the code, which nothing here imports), and a
# module that cannot compile (torch's Python-3.12 test helper), as pip leaves it.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "pip>=25.1"
	$(BIN)/python -m pip install --quiet --no-compile torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	$(BIN)/python -m compileall -qq -j 0 -x 'site-packages/.*/tests?/' $(VENV)/lib || true
	touch $@

# A killed run resumes with the same command (docs/troubleshooting-resume.md). ARGS: more
# Snakemake arguments, e.g. make run ARGS="--configfile config/presets/mnist.yaml". The jobs
# fork from a job server that has imported torch once (crosslip.jobserver).
run: $(STAMP)
	$(BIN)/python -m crosslip.jobserver -- $(BIN)/snakemake --cores $(CORES) --rerun-incomplete $(ARGS)

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

"""Shared builders for the tests: small random models with controllable shapes, and readers
of Snakemake's dry-run listing."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import runpy
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from crosslip.data import Dataset, load_dataset, save_prepared
from crosslip.data.dataset import default_class_names
from crosslip.jobserver import server as job_server
from crosslip.models import SoftplusNet

#: The repository and the snakemake of this environment.
ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
#: The same command, forked from the job server that :data:`crosslip.jobserver.handoff.ENV` names
#: (tests/served_snakemake.py): what :func:`snakemake_cmd` gives while a server is named.
SERVED_SNAKEMAKE = (sys.executable, str(ROOT / "tests" / "served_snakemake.py"))

#: The environment variable that names the folder of the files the repository does not hold
#: and some tests compare with (docs/architecture.md, "Files from outside the repository"):
#: ``data/mnist/`` (the official MNIST files), ``paper/`` (the paper's LaTeX source) and
#: ``gpu-runs/`` (the H100 runs that docs/reproduction/mnist-h100-* were exported from).
#: ``.ci/run`` sets it.
SHARED_ENV = "CROSSLIP_SHARED"


def shared_path(*parts: str, files: Sequence[str] = ()) -> Path:
    """``$CROSSLIP_SHARED/<parts...>``, which must exist, with each of ``files`` in it. Skips
    the running test where the variable is unset or empty; fails it where the path or one of
    ``files`` is missing."""
    root = os.environ.get(SHARED_ENV, "")
    if not root:
        pytest.skip(
            f"{SHARED_ENV} is not set: it names the folder of data/mnist, paper/ and gpu-runs/"
            " that this test reads"
        )
    path = Path(root).joinpath(*parts)
    missing = [str(path / f) for f in files if not (path / f).is_file()]
    assert path.exists() and not missing, (
        f"missing under {SHARED_ENV}={root}: {', '.join(missing) or path}"
    )
    return path


#: The test that runs now (tests/conftest.py sets it): read by :func:`require_slow`.
RUNNING: dict[str, pytest.Item | None] = {"item": None}


def require_slow(what: str = "runs Snakemake") -> None:
    """Fail the running test unless it is marked ``slow``: a test that runs Snakemake
    belongs to the full tier, never to ``make test-fast``. Every way the tests start
    Snakemake goes through :func:`snakemake_cmd`, which calls this, so the fast tier cannot
    silently come to run workflows."""
    item = RUNNING["item"]
    if item is not None and item.get_closest_marker("slow") is None:
        pytest.fail(
            f"{item.nodeid} {what} but is not marked slow: add @pytest.mark.slow "
            "(make test-fast leaves such tests out; docs/testing.md)",
            pytrace=False,
        )


def snakemake_cmd(
    workdir: Path,
    *args: str,
    configfile: Path | None = None,
    snakefile: Path | None = None,
    served: bool = True,
) -> list[str]:
    """``snakemake -s <snakefile> --directory <workdir> [--configfile <configfile>] <args>``;
    the snakefile is the repository's unless given. Only for tests marked ``slow``
    (:func:`require_slow`).

    While this process names a job server (:data:`crosslip.jobserver.handoff.ENV`, set for the
    ``slow`` tests by tests/conftest.py) and ``served``, a command that runs jobs starts as
    :data:`SERVED_SNAKEMAKE`: Snakemake then runs in a fork of the server, which has
    imported it once (about 1.3 s of CPU less per run), with the same arguments,
    environment, working folder and exit status. A command that runs no job
    (:data:`NO_JOB_OPTIONS`) keeps ``snakemake``: :func:`run_snakemake` runs it in this
    process."""
    require_slow()
    head = [SNAKEMAKE]
    if served and os.environ.get(job_server.ENV) and NO_JOB_OPTIONS.isdisjoint(args):
        head = list(SERVED_SNAKEMAKE)
    cmd = [*head, "-s", str(snakefile or ROOT / "Snakefile"), "--directory", str(workdir)]
    return cmd + (["--configfile", str(configfile)] if configfile else []) + list(args)


#: Options after which Snakemake runs no job and writes no result (a dry run, the lint, the
#: summary, the rule list): :func:`run_snakemake` runs such a command in the test process.
NO_JOB_OPTIONS = frozenset(
    {"-n", "--dry-run", "--dryrun", "--lint", "--summary", "-S", "--detailed-summary", "-D"}
    | {"--list-rules", "-l"}
)


def runs_in_process(cmd: list[str]) -> bool:
    """Whether :func:`run_snakemake` runs ``cmd`` in this process: a :func:`snakemake_cmd`
    with an option of :data:`NO_JOB_OPTIONS`. Its Snakefile imports the installed crosslip
    there as in a process of its own, also for a copy of the workflow (tests/test_rerun.py)."""
    return cmd[0] == SNAKEMAKE and not NO_JOB_OPTIONS.isdisjoint(cmd)


#: The warning filters of a new Python process (``python -W`` unset, not a debug build),
#: first match first: pytest's own (``always`` for deprecations) do not apply to a command.
FRESH_WARNING_FILTERS = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
)


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Python's way of showing a warning, to the ``sys.stderr`` of now."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _as_a_command(argv: list[str], env: dict[str, str] | None, cwd: Path | str | None):
    """This process as the process of ``argv`` within the block: its arguments, environment
    and working directory; no handler on the root logger (a message that Snakemake logs
    before it has set up its own logging then goes to stderr by Python's last resort, as in
    a new process, instead of to pytest's log capture); warnings filtered and printed to
    stderr as in a new process. Afterwards the block's changes are undone: the working
    directory (``--directory``), the environment, ``sys.path`` (the workflow's folders),
    ``sys.argv``, the SIGINT and SIGTERM handlers (Snakemake's scheduler sets one), the
    warning filters, the levels and handlers of the root logger and Snakemake's loggers, and
    Snakemake's cache of script modification times (``snakemake.jobs.get_script_mtime``, a
    process-wide cache that would hide a script edited between two commands). Snakemake
    reads the run directory of its header once, at import (``Workflow._rundir``): within
    the block it is the block's working directory, as in a new process."""
    import snakemake.jobs
    import snakemake.workflow

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    loggers = [logging.getLogger(), *map(logging.getLogger, ("snakemake", "snakemake.logging"))]
    saved_loggers = [(lg, lg.level, list(lg.handlers)) for lg in loggers]
    saved_rundir = snakemake.workflow.Workflow._rundir
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = list(argv)
        snakemake.workflow.Workflow._rundir = str(Path.cwd().absolute())
        logging.getLogger().handlers.clear()
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(FRESH_WARNING_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _print_warning
            yield
    finally:
        os.chdir(saved_cwd)
        if dict(os.environ) != saved_env:
            os.environ.clear()
            os.environ.update(saved_env)
        sys.path[:], sys.argv = saved_path, saved_argv
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        for lg, level, handlers in saved_loggers:
            lg.setLevel(level)
            lg.handlers[:] = handlers
        snakemake.jobs.get_script_mtime.cache_clear()
        snakemake.workflow.Workflow._rundir = saved_rundir


def run_snakemake(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess:
    """Run a :func:`snakemake_cmd` command line and capture its output, as
    ``subprocess.run(cmd, capture_output=True, text=True, ...)`` does.

    A command that runs no job (:func:`runs_in_process`) runs in this process: through
    ``snakemake.cli.main``, the function that the ``snakemake`` command calls, with the same
    arguments, environment and working directory (:func:`_as_a_command`). It lists the same
    jobs and prints the same messages to stdout and stderr, and costs about 1.4 s of CPU
    less than a new process (Snakemake's imports and the workflow's, made once per test
    process). Not the same: output that a child process writes to the file descriptors
    itself (a dry run starts none), and ``timeout``, which applies only to a process of its
    own. Every command that runs jobs runs in a process of its own, as users run it."""
    if not runs_in_process(cmd):
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
        )
    from snakemake.cli import main  # before the state is saved: its import extends sys.path

    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with _as_a_command(cmd, env, cwd):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(cmd[1:])
            except SystemExit as e:
                code = e.code
    if isinstance(code, str):  # sys.exit("message"): printed, exit status 1
        err.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(cmd, code or 0, out.getvalue(), err.getvalue())


def without_stamps(text: str) -> list[tuple[str, ...]]:
    """The lines of a Snakemake output but those that differ between two starts (the time
    stamps, and the date and workflow id of its header), sorted, each as its sorted items
    (split after commas, semicolons and colons): Snakemake lists some sets (the jobs, a
    job's reasons) in the order of Python's string hashes, which differ between processes.
    The environment's folder is named one way: a traceback names it as the process found
    it, through the path of the ``snakemake`` command's interpreter or of this one, which
    differ where the environment is a symbolic link."""
    for prefix in {os.path.realpath(sys.prefix), sys.prefix}:
        text = text.replace(prefix, "<env>")
    return sorted(
        tuple(sorted(re.split(r"[,;:] ", line)))
        for line in text.splitlines()
        if not re.fullmatch(r"\[\w{3} \w{3} +\d+ [\d:]+ \d{4}\]", line)
        and not line.lstrip().startswith(("Date:", "Workflow ID:"))
    )


def random_net(
    d: int, k: int, h: int, seed: int, scale: float = 1.0, bias: bool = True
) -> SoftplusNet:
    """A random one-hidden-layer softplus net in float64 (weights ~ N(0, scale^2/fan_in))."""
    g = torch.Generator().manual_seed(seed)
    net = SoftplusNet(d, k, hidden=h, alpha=10.0, bias=bias).double()
    with torch.no_grad():
        net.hidden_layer.weight.copy_(
            torch.randn(h, d, generator=g, dtype=torch.float64) * scale / d**0.5
        )
        net.output_layer.weight.copy_(
            torch.randn(k, h, generator=g, dtype=torch.float64) * scale / h**0.5
        )
        if bias:
            net.hidden_layer.bias.copy_(torch.randn(h, generator=g, dtype=torch.float64) * 0.1)
            net.output_layer.bias.copy_(torch.randn(k, generator=g, dtype=torch.float64) * 0.1)
    return net.eval()


class UncheckedDataset(Dataset):
    """A :class:`Dataset` whose arrays go unchecked: points in float64 (trainings that the
    tests compare in float64) or beyond [0, 1] (random blobs), which :class:`Dataset`
    refuses and no loader gives, and which the trainers take as they take any points."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_names", default_class_names(self.num_classes))


def toy_dataset(
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    n_test: int | None = None,
    shape: tuple[int, ...] | None = None,
    checked: bool = True,
) -> Dataset:
    """The points ``x`` (n, d) with labels ``y`` (n,) as a dataset named ``toy`` to train on:
    its test split the first ``n_test`` of them (all where None), its ``shape`` flat (d,)
    unless given. A :class:`Dataset`, which checks the arrays (float32 in [0, 1]), or where
    not ``checked`` an :class:`UncheckedDataset`."""
    kind = Dataset if checked else UncheckedDataset
    shape = (x.shape[1],) if shape is None else shape
    return kind("toy", x, y, x[:n_test], y[:n_test], shape, num_classes)


def random_points(n: int, d: int, seed: int) -> torch.Tensor:
    """Points in the unit box [0, 1]^d, float64."""
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def files_in(folder) -> list[str]:
    """Names of everything in ``folder`` (hidden temporaries included); [] if absent."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def dry_run_jobs(stdout: str) -> list[dict]:
    """The jobs that a dry run (``snakemake -n``) lists, in order: ``rule``, then every
    ``key: value`` line under it as printed (``wildcards`` e.g. ``dataset=x, model=y``, ""
    when none; read ``wildcards`` and ``resources`` with :func:`fields`), except ``input``
    and ``output``: lists of paths ([] when none)."""
    jobs, job = [], None
    for line in stdout.splitlines():
        head = line.split()
        kinds = ("rule", "localrule", "checkpoint", "localcheckpoint")
        if len(head) == 2 and head[0] in kinds and head[1].endswith(":"):
            job = {"rule": head[1][:-1], "wildcards": "", "input": [], "output": []}
            jobs.append(job)
        elif job is not None and line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            job[key] = value.split(", ") if key in ("input", "output") else value
        else:
            job = None
    return jobs


def stage_of(rule: str) -> str:
    """The stage of a rule: a batched rule (``train_grid_*``, ``certify_grid_*``,
    ``attack_grid_*``: crosslip.jobs.batches) counts as its per-model rule."""
    return rule.split("_grid_")[0] if "_grid_" in rule else rule


def trained_models(jobs: list[dict]) -> list[str]:
    """The model ids that the training jobs of a dry-run listing (:func:`dry_run_jobs`)
    train, one per model of a ``train`` job, every model of a batched one."""
    return [
        Path(out).parent.name
        for job in jobs
        if stage_of(job["rule"]) == "train"
        for out in job["output"]
        if out.endswith("model.pt")
    ]


def fields(text: str) -> dict[str, str]:
    """``a=1, b=x`` (a dry run's wildcards or resources) -> ``{"a": "1", "b": "x"}``."""
    return dict(item.split("=", 1) for item in text.split(", ")) if text else {}


def dry_run_counts(stdout: str) -> dict[str, int]:
    """The dry run's job stats: rule -> number of jobs, and ``total``; ``{"total": 0}`` where
    it says that there is nothing to be done."""
    lines = stdout.splitlines()
    if "Job stats:" not in lines:
        assert "Nothing to be done" in stdout, stdout[-3000:]
        return {"total": 0}
    counts = {}
    for line in lines[lines.index("Job stats:") + 3 :]:  # after the header and the rule
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


#: The benchmarks. Each runs as ``python benchmarks/<name>.py``, which puts this folder first
#: on ``sys.path``: ``_harness`` and the sibling benchmarks import from there.
BENCHMARKS = ROOT / "benchmarks"


@contextlib.contextmanager
def as_benchmark(name: str, *args: str) -> Iterator[None]:
    """Within the block, this process sees what ``python benchmarks/<name> <args>`` sees:
    ``sys.argv`` and the benchmarks' folder first on ``sys.path``. What a benchmark may
    change in the process (those two, torch's thread count, the global random state) is
    restored afterwards."""
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    argv, path = sys.argv, list(sys.path)
    sys.argv = [name, *args]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = argv, path
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)


def run_benchmark(name: str, *args: str) -> list[str]:
    """The output lines of ``benchmarks/<name> <args>``, run as ``__main__`` in this process
    (:func:`as_benchmark`; it must succeed), which saves a Python and torch start-up per
    run."""
    out = io.StringIO()
    with as_benchmark(name, *args), contextlib.redirect_stdout(out):
        runpy.run_path(str(BENCHMARKS / name), run_name="__main__")
    return out.getvalue().splitlines()


def benchmark_module(name: str) -> dict[str, Any]:
    """The globals of ``benchmarks/<name>`` loaded as a module, its ``main`` not run."""
    with as_benchmark(name):
        return runpy.run_path(str(BENCHMARKS / name))


#: The smallest arguments of each benchmark that still exercise all of it: the CPU smoke
#: tests (tests/test_benchmarks.py) and the CUDA runs (tests/test_cuda.py) use these. One
#: torch thread: the suite's pytest-xdist workers already keep every core busy.
TINY_BENCH_ARGS: dict[str, list[str]] = {
    "bench_train.py": [
        *("--rounds", "1", "--rounds-1024", "1", "--block", "1", "--threads", "1"),
        *("--hidden", "64", "--kernel-centers", "50", "--kernel-iterations", "2"),
    ],
    "bench_pipeline.py": [
        *("--points", "20", "--epochs", "1", "--reference-points", "3", "--threads", "1")
    ],
    "bench_kernel_bound.py": [
        *("--centers", "60", "--points", "8", "--reference-points", "2", "--threads", "1")
    ],
    "bench_grid.py": [
        *("--sizes", "1", "3", "--points", "96", "--rounds", "1", "--hidden", "16"),
        *("--threads", "1"),
    ],
    "bench_adversarial.py": [
        *("--sizes", "1", "3", "--points", "96", "--rounds", "1", "--steps", "1"),
        *("--hidden", "16", "--threads", "1"),
    ],
    "bench_compile.py": [
        *("--sizes", "1", "2", "--steps", "2", "--rounds", "1", "--hidden", "16"),
        *("--backend", "aot_eager", "--threads", "1"),  # inductor's C++ build: a minute
    ],
    "bench_min_norm.py": [
        *("--dataset", "mnist5k", "--hidden", "32", "--epochs", "1", "--points", "12"),
        *("--steps", "5", "--targets", "2", "--restarts", "1", "--refine-steps", "1"),
        *("--tol", "1e-3", "--patience", "2", "--prune", "1.5", "--thorough-points", "8"),
        *("--table-points", "4", "--settings", "5:1:0:1e-3:2:1.5", "5:2:1:0:0:0"),
        *("--threads", "1"),
    ],
    "bench_preset.py": [
        *("--dataset", "mnist5k", "--hidden", "8", "--train-points", "128", "--epochs", "1"),
        *("2", "--points", "4", "--models-per-setting", "2", "--startup-runs", "1"),
        *("--threads", "1"),
    ],
}


#: Training parameters of a small net that learns :func:`learnable_digits` (784-32-10,
#: Cross-Lipschitz, 3 epochs): the CUDA tests' model (tests/test_cuda.py) and its CPU twin
#: (tests/test_devices.py).
LEARNABLE_NET = {
    "regularizer": "cross_lipschitz",
    "lam": 1e-3,
    "lr": 0.2,
    "epochs": 3,
    "hidden": 32,
    "seed": 0,
}
#: The test error a net trained with :data:`LEARNABLE_NET` on :func:`learnable_digits` stays
#: below on any device (on the CPU 0.165, 0.16 and 0.18 for seeds 0, 1 and 2; a model that
#: learned nothing errs on 0.9 of ten balanced classes).
LEARNABLE_ERROR = 0.3


def learnable_digits(path: Path, n_train: int = 2000, n_test: int = 200) -> Path:
    """A fixed-seed sample of ``n_train`` training and ``n_test`` test digits of the embedded
    ``mnist5k`` (all ten classes; mnist5k is sorted by class, so a leading slice would hold
    one or two), written as a prepared dataset to ``path``; returns ``path``."""
    ds = load_dataset("mnist5k")
    rng = np.random.default_rng(0)
    tr = np.sort(rng.permutation(len(ds.x_train))[:n_train])
    te = np.sort(rng.permutation(len(ds.x_test))[:n_test])
    sample = Dataset(
        "digits", ds.x_train[tr], ds.y_train[tr], ds.x_test[te], ds.y_test[te], ds.shape, 10
    )
    save_prepared(sample, path)
    return path

"""Shared fixtures (a local HTTP server and a closed port for the data tests; the finished
workflow runs that the workflow tests inspect, each made once per test session) and the
tiers: a test that runs Snakemake is marked ``slow`` (docs/testing.md).

``make test`` runs the tests in pytest-xdist workers (``-n auto --dist loadgroup``): the
tests of one shared run form one ``xdist_group``, so that one worker makes the run and no
other worker repeats it. Each worker is a separate process with its own session fixtures
and temporary folders, so the grouping saves time and changes no result.

The jobs of the Snakemake runs fork from a job server (crosslip.jobserver) that each
process starts before its first ``slow`` test, as ``make run`` does: it saves the 2 s of
imports of each job. The runs' Snakemake itself forks from it too
(tests/served_snakemake.py, ``helpers.snakemake_cmd``). ``CROSSLIP_FORKSERVER=`` (set and
empty) runs every job and run in a process of its own; the tests of what only such a
process does (signals to a run's jobs, tests/test_interruptions.py; a SLURM job's process,
tests/test_resume.py) take the server out of their own runs (``jobs_in_own_processes``).

The SLURM tests' runs, which mostly wait, start in the background as soon as the session
has selected one of those tests (tests/slurm_cluster.py), in a folder that the controller
makes, gives to every worker and removes at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from crosslip.jobserver import server as job_server

from . import helpers, slurm_cluster

#: Session fixtures that run a workflow: a test that uses one is marked ``slow`` here.
WORKFLOW_FIXTURES = frozenset({"load_run", "tiny_run", "one_model_run"})


def pytest_configure(config):
    """One torch thread in each pytest-xdist worker: the workers already keep the cores
    busy, and torch's spinning worker threads on an oversubscribed core cost more than they
    save (the fast tier in two workers: 165 s with two threads each, 35 s with one). The
    controller (or the one process) makes the session's folder for the SLURM cluster."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    if not hasattr(config, "workerinput"):
        config.stash[slurm_cluster.FOLDER] = Path(tempfile.mkdtemp(prefix="crosslip-slurm-"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Each pytest-xdist worker gets the session's folder for the SLURM cluster."""
    folder = node.config.stash[slurm_cluster.FOLDER]
    node.workerinput[slurm_cluster.WORKER_KEY] = str(folder)


def pytest_collection_finish(session):
    """Start the SLURM tests' runs in the background (tests/slurm_cluster.py) as soon as the
    session has selected one of those tests: in one process only (the first worker), and
    not for ``--collect-only``."""
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    if any(item.nodeid.startswith(slurm_cluster.TESTS) for item in session.items):
        slurm_cluster.start(slurm_cluster.session_folder(session.config))


#: This process's job server (started before its first ``slow`` test), and its folder.
JOB_SERVER: dict[str, object] = {}

#: Whether the environment named a job server (or none, set empty) before the session.
USER_JOB_SERVER = job_server.ENV in os.environ

#: What this process's job server imports: the jobs' modules, and Snakemake's, for the runs
#: that start as ``helpers.SERVED_SNAKEMAKE`` (tests/served_snakemake.py).
PRELOAD = (*job_server.PRELOAD, "snakemake.cli")


def pytest_runtest_setup(item):
    """Before each test, and so for its session fixtures' runs too: a ``slow`` test's
    Snakemake runs get this process's job server (started before the first), the other
    tests' subprocesses none; unless the environment named one (or none) already."""
    if USER_JOB_SERVER or not job_server.supported():
        return
    if not item.get_closest_marker("slow"):
        os.environ.pop(job_server.ENV, None)
        return
    if not JOB_SERVER:
        folder = Path(tempfile.mkdtemp(prefix="crosslip-jobs-"))
        log = (folder / "server.log").open("w")
        JOB_SERVER.update(
            folder=folder,
            log=log,
            process=job_server.start_server(
                folder / "socket", PRELOAD, stdout=log, stderr=subprocess.STDOUT
            ),
        )
    os.environ[job_server.ENV] = str(JOB_SERVER["folder"] / "socket")


@pytest.fixture
def jobs_in_own_processes(monkeypatch) -> str | None:
    """The test's Snakemake runs start each job in a process of its own, without the job
    server: for the tests of what signals to a run do to its jobs' processes. Its value:
    the server's socket that it took out (None if none was named), for a later command of
    the test whose process model is not the point (``monkeypatch.setenv``)."""
    taken = os.environ.get(job_server.ENV)
    monkeypatch.delenv(job_server.ENV, raising=False)
    return taken


def pytest_unconfigure(config):
    """This process's job server, if it started one: stop it, remove its folder. The
    controller, once every worker has ended: stop the SLURM cluster and its run (if the
    session started them) and remove their folder."""
    if JOB_SERVER:
        JOB_SERVER["process"].terminate()
        JOB_SERVER["process"].wait()
        JOB_SERVER["log"].close()
        shutil.rmtree(JOB_SERVER["folder"], ignore_errors=True)
        os.environ.pop(job_server.ENV, None)
        JOB_SERVER.clear()
    if not hasattr(config, "workerinput") and slurm_cluster.FOLDER in config.stash:
        folder = config.stash[slurm_cluster.FOLDER]
        slurm_cluster.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that uses a workflow fixture, before ``-m`` selects (a test
    that starts Snakemake in another way and is not marked fails: helpers.require_slow),
    and put it in the ``xdist_group`` of that fixture (before pytest-xdist reads groups)."""
    for item in items:
        shared = sorted(WORKFLOW_FIXTURES & set(item.fixturenames))
        if shared and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if shared and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(shared[0]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Let helpers.require_slow see which test runs (its fixtures' set-up included)."""
    helpers.RUNNING["item"] = item
    try:
        return (yield)
    finally:
        helpers.RUNNING["item"] = None


@dataclass
class Server:
    """What the ``server`` fixture serves (``root``), where (``url``), the paths requested so
    far, and the names it sends cut short (``truncated``)."""

    root: Path
    url: str
    requests: list[str] = field(default_factory=list)
    truncated: set[str] = field(default_factory=set)

    def put(self, name: str, data: bytes) -> None:
        (self.root / name).write_bytes(data)

    def put_all(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            self.put(name, data)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """HTTP server on 127.0.0.1 serving ``tmp_path/served``. Two ways to interrupt a transfer:

    * ``/truncated/<anything>`` announces 100000 bytes, sends a few bytes that start like a
      gzip file, then closes the connection;
    * a served name in ``Server.truncated`` announces 1000 bytes more than the file and sends
      the first half of it.
    """
    root = tmp_path / "served"
    root.mkdir()
    state = Server(root, "")

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def _cut_short(self, announced: int, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(announced))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True

        def do_GET(self):
            state.requests.append(self.path)
            name = self.path.lstrip("/")
            if self.path.startswith("/truncated/"):
                return self._cut_short(100_000, b"\x1f\x8b" + b"partial body" * 10)
            if name in state.truncated and (root / name).is_file():
                data = (root / name).read_bytes()
                return self._cut_short(len(data) + 1000, data[: len(data) // 2])
            super().do_GET()

        def log_message(self, *args):  # keep pytest output quiet
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nobody else takes it), not listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture(scope="session")
def load_run(tmp_path_factory):
    """The load test's sweep of 32 jobs on 2 cores (run once per test session):
    (work folder, planned jobs, finished jobs by rule, output watcher, seconds). The
    interruption test uses it as its uninterrupted reference."""
    from .workflow_helpers import run_load

    return run_load(tmp_path_factory.mktemp("load"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The work folder of a finished run of workflow_helpers.TINY_RUN (run once per test
    session), which the pipeline tests inspect. A test that changes a run copies it first
    (``shutil.copytree(tiny_run, ..., symlinks=True)``)."""
    from .workflow_helpers import run_tiny

    return run_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def one_model_run(tmp_path_factory) -> Path:
    """The work folder of a finished run of workflow_helpers.ONE_MODEL (run once per test
    session). Inspect it as it is; a test that changes a run copies it first
    (``shutil.copytree(one_model_run, ..., symlinks=True)``)."""
    from .workflow_helpers import run_one_model

    return run_one_model(tmp_path_factory.mktemp("one_model") / "work")

"""A gate that holds a run's jobs until the test lets them go.

A run started with :attr:`JobGate.env` has the gate's folder first on ``PYTHONPATH``, and
in it a ``sitecustomize`` module (:data:`SITECUSTOMIZE`), which Python imports as it starts,
before the program. In the process of a workflow script job (its command line names
Snakemake's copy of the script, ``.snakemake/scripts/tmp….RULE.py``: ``python SCRIPT``,
or ``python -m crosslip.jobserver.handoff SCRIPT`` under a job server) it connects to the gate's
socket, says which process and script it is, and waits for the gate's answer; every other
process (``make``'s, the job server's, Snakemake's) goes on at once. Where it waits:

* ``at="start"``: before the program starts. The job is started and unfinished, its run
  alive with its lock and Snakemake's lock files. This works whichever way the run was
  started (the plain command, a profile, ``make run`` with its own job server): a served
  job waits in the process that hands it to the server, before the fork exists.
* ``at="log"``: when the job's script opens its log (an audit hook on ``open``, right
  before its main function, after its imports): the job's own process, inside its
  program, as a signal finds it while it computes. Only for jobs that run in their own
  processes (the fork of a job server starts no Python, so runs no ``sitecustomize``).

Either way the test holds the job for as long as it wants, however fast or loaded the
machine. :meth:`JobGate.let_go` lets one held job go on as if nothing had held it;
:meth:`JobGate.close` lets every held job go and removes the socket, so that the run's
later jobs go on at once.
"""

from __future__ import annotations

import ast
import os
import pickle
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: The environment variables that name the gate's socket and where it holds a job.
ENV = "CROSSLIP_TEST_GATE"
AT = "CROSSLIP_TEST_GATE_AT"

#: The gate's ``sitecustomize`` module, run at the start of every Python process of a run.
SITECUSTOMIZE = f'''"""crosslip's test gate (tests/job_gate.py): hold a job."""


def _hold(script: str) -> None:
    import os
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.environ["{ENV}"])
        sock.sendall(f"{{os.getpid()}} {{script}}\\n".encode())
        sock.recv(1)  # the gate's answer, or its end
    except OSError:
        pass  # the gate is closed: go on
    finally:
        sock.close()


def _main() -> None:
    import os
    import sys

    if not os.environ.get("{ENV}") or os.environ.get("{ENV}_HELD") == str(os.getpid()):
        return  # no gate, or this process was held before it exec'ed (crosslip.jobserver.handoff)
    scripts = [a for a in sys.orig_argv if "/.snakemake/scripts/" in a and a.endswith(".py")]
    if not scripts:
        return
    os.environ["{ENV}_HELD"] = str(os.getpid())
    if os.environ.get("{AT}") != "log":
        _hold(scripts[0])
        return
    rule = scripts[0].rsplit(".", 2)[-2]
    waiting = [True]

    def hook(event: str, args: tuple) -> None:
        if event == "open" and waiting[0] and isinstance(args[0], str):
            if f"logs/{{rule}}/" in args[0] and args[0].endswith(".log"):
                waiting[0] = False
                _hold(scripts[0])

    sys.addaudithook(hook)


_main()
'''


@dataclass
class HeldJob:
    """A job's process that waits at the gate: its process id, its script, and the job's
    rule and wildcards (read as it arrives: Snakemake removes its copy of the script once
    the job has ended)."""

    pid: int
    script: str
    conn: socket.socket
    wildcards: dict[str, str]

    @property
    def rule(self) -> str:
        """The rule, from the script's name (``tmp….RULE.py``)."""
        return Path(self.script).name.split(".")[-2]


def script_wildcards(script: str) -> dict[str, str]:
    """A job's wildcards, from the ``snakemake`` object that Snakemake pickled into the
    preamble of its copy of the script (``pickle.loads(b'…')`` or with double quotes)."""
    text = Path(script).read_text()
    found = re.search(r"""pickle\.loads\((b'(?:[^'\\]|\\.)*'|b"(?:[^"\\]|\\.)*")\)""", text)
    assert found, f"no pickled snakemake object in {script}"
    return dict(pickle.loads(ast.literal_eval(found[1])).wildcards.items())


class JobGate:
    """The gate (module docstring), in a folder of its own under the temporary folder (a
    socket's path has at most 107 bytes); :attr:`env` is the environment of a run whose jobs
    it holds. A context manager: its end lets every held job go and removes the folder."""

    def __init__(self, at: str = "start") -> None:
        assert at in ("start", "log"), at
        self.folder = Path(tempfile.mkdtemp(prefix="crosslip-gate-"))
        (self.folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.path = self.folder / "socket"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen()
        self.held: list[HeldJob] = []
        path = os.pathsep.join(filter(None, [str(self.folder), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": path, ENV: str(self.path), AT: at}

    def hold(self, rule: str, *procs: subprocess.Popen, timeout: float = 300) -> HeldJob:
        """The next job of ``rule`` that reaches the gate, held; the jobs of other rules
        that reach it first are let go, and so is every job after it: the gate closes to
        them (:meth:`shut`). Fails if every one of ``procs`` (the runs that may start it)
        has ended first, or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            job = self._accept(*procs, timeout=deadline - time.monotonic())
            if job.rule == rule:
                self.shut()
                return job
            self.let_go(job)

    def shut(self) -> None:
        """Let no more jobs in: the socket goes, so a job that comes later, or waits to be
        taken, goes on at once. The jobs held so far stay held."""
        self.path.unlink(missing_ok=True)
        self.listener.close()

    def _accept(self, *procs: subprocess.Popen, timeout: float) -> HeldJob:
        """The next job that reaches the gate, held."""
        deadline = time.monotonic() + timeout
        self.listener.settimeout(0.2)
        while True:
            try:
                conn, _ = self.listener.accept()
                break
            except TimeoutError:
                ended = [p for p in procs if p.poll() is not None]
                if procs and len(ended) == len(procs):
                    out = "\n".join((p.stdout.read() if p.stdout else "")[-3000:] for p in ended)
                    raise AssertionError(f"every run ended before a job started:\n{out}") from None
                assert time.monotonic() < deadline, "no job started"
        conn.settimeout(60)
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            assert chunk, "a job's process left the gate before saying which it is"
            line += chunk
        pid, script = line.decode().rstrip("\n").split(" ", 1)
        job = HeldJob(int(pid), script, conn, script_wildcards(script))
        self.held.append(job)
        return job

    def let_go(self, job: HeldJob) -> None:
        """Let a held job's process go on (nothing to answer where it has been killed)."""
        self.held.remove(job)
        try:
            job.conn.sendall(b"\n")
        except OSError:
            pass
        finally:
            job.conn.close()

    def close(self) -> None:
        """Let every held job go, and no more in."""
        self.shut()
        while self.held:
            self.let_go(self.held[-1])
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> JobGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

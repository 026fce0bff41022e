"""The job server: one process imports torch, pandas, matplotlib and crosslip's stages once,
and each workflow job of a local run is forked from it instead of starting Python afresh.

A job of this workflow computes for a fraction of a second on a small config, after about
2 s of CPU spent importing (torch alone about 1.4 s). Run Snakemake under the server
(``make run`` does)::

    python -m crosslip.jobserver -- snakemake --cores all ...

It starts the server on a UNIX socket in a new temporary folder, runs the command with
:data:`ENV` naming that socket, and stops the server when the command ends (its exit status
is the command's). Each job's script still starts as its own process, as Snakemake's
``script:`` directive starts it, a small one: after Snakemake's preamble,
:func:`crosslip.io.scripts.run_script` asks the server to run the file with the same
``sys.argv``, working folder, environment, ``sys.path``, umask and standard streams in a
fresh fork, then waits and exits with the fork's status
(:func:`crosslip.jobserver.handoff.hand_off`), before the script imports anything heavy.
The fork runs the script from there, so it is the same code as a job in its own process,
minus the imports.

What a served job does not share with a job in its own process:

- **Signals.** The fork has a process group of its own. The job's process passes on the
  signals it gets (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT) and
  ends with the fork's status, or by the signal that ended the fork. A signal that comes
  before the fork exists (the server still imports) reaches the fork before its script's
  first line, as it would end a process of its own before the script. A SIGKILL of the job's
  process closes its connection, and the server then kills the fork's group (SIGKILL). If
  the server dies, its forks die with it (``PR_SET_PDEATHSIG``). SIGSTOP, which no process
  can pass on, stops only the job's process.
- **Measurements of the job's process.** Snakemake's ``benchmark:`` files time the job's
  process: the wall time (``s``, the only column crosslip reads) is the job's; its CPU and
  memory columns are the waiting process's, not the fork's.
- **State imported before the fork.** Modules are imported with the server's environment;
  the job's environment is set before its script runs. numpy's global random state is the
  server's in every fork (crosslip draws only from generators it seeds; Python's
  ``random`` reseeds after a fork), and so is the seed of Python's string hashes (a set of
  strings iterates in the same order in every served job; alone, in each process's own).
  What the imports made is frozen (``gc.freeze``): a fork's garbage collections do not
  walk it, nor write to the pages it lies in, which the fork would then have to copy.

At its end the fork does what Python does at exit: it waits for its threads that are not
daemons, runs the ``atexit`` functions and flushes its streams.

A job runs in its own process, as without the server, when the server is not reachable
(on another node), when the job runs in a batch job (SLURM and others) that the server does
not run in, when the job's interpreter, ``sys.prefix`` or crosslip differ from the server's
(a ``conda:`` environment of another Python), or when the server has initialized CUDA (a
fork cannot use it; the server never computes, so this is a guard); a line on its stderr
says why, and the job's process becomes ``python SCRIPT`` without :data:`ENV`. The server
needs Linux (``os.pidfd_open``); elsewhere the command runs without it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import gc
import importlib
import io
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .handoff import (
    ACCEPTED,
    BATCH_JOB_VARS,
    ENV,
    FORWARDED,
    HEADER,
    READY,
    REFUSED,
    STATUS,
    end_by,
    enter_fork,
    identity,
    recv_exactly,
    supported,
)

#: What the server imports before it accepts a job: every module that a workflow script
#: imports (workflow/scripts/), so that no served job imports anything heavy.
PRELOAD: tuple[str, ...] = (
    "torch",
    "pandas",
    "pyarrow.parquet",
    "matplotlib.pyplot",
    "snakemake.script",
    "crosslip.stages.attack",
    "crosslip.stages.certification",
    "crosslip.stages.data",
    "crosslip.stages.external",
    "crosslip.stages.instances",
    "crosslip.stages.training",
    "crosslip.report",
    "crosslip.jobs.selection",
    "crosslip.jobs.files",
    "crosslip.config.specs",
)

#: The longest path of a UNIX socket on Linux (``sun_path``, 108 bytes with its NUL).
MAX_SOCKET_PATH = 107

_PR_SET_PDEATHSIG = 1


# --- the server's side -----------------------------------------------------------------------


def _refusal(request: dict[str, Any], forks: set[int]) -> str | None:
    """Why the server cannot run this job in a fork, or None if it can; ``forks``: the
    process ids of the server's running forks."""
    if request.get("pid") in forks:
        return "the job already runs in a fork of this server"
    env = request.get("env", {})
    for var in BATCH_JOB_VARS:
        if env.get(var) != os.environ.get(var):
            where = f"in {var}={os.environ[var]}" if var in os.environ else "outside it"
            return f"the job runs in the batch job {var}={env.get(var)}, the server {where}"
    ours = identity()
    for key, theirs in request.get("identity", {}).items():
        if ours.get(key) != theirs:
            return f"the job's {key} is {theirs}, the server's {ours.get(key)}"
    if set(ours) != set(request.get("identity", {})):
        return "the job did not say which interpreter and crosslip it runs"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the server has initialized CUDA, which a fork cannot use"
    return None


def _die_with_parent(signum: int) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _new_stdio(unbuffered: bool) -> None:
    """New ``sys.stdin``/``stdout``/``stderr`` on file descriptors 0-2, buffered as Python
    buffers them at start-up (stdout by line on a terminal, stderr by line)."""
    enc, errs = sys.stdout.encoding, sys.stdout.errors

    def text(fd: int, mode: str, line: bool, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            buffered,
            encoding=enc,
            errors=errors,
            line_buffering=line,
            write_through=unbuffered and mode == "w",
        )

    sys.stdin = text(0, "r", False, errs)
    sys.stdout = text(1, "w", os.isatty(1), errs)
    sys.stderr = text(2, "w", True, "backslashreplace")


def _exit_status(code: Any) -> int:
    """The exit status of ``sys.exit(code)``, printing a message as Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_job(request: dict[str, Any], fds: list[int], go: int) -> int:
    """In the fork: become the job's process and run its script; the exit status. ``go``:
    the pipe on which the server releases the fork once the job's process has passed on
    the signals that came before the fork was known (:data:`READY`)."""
    enter_fork()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    for s in FORWARDED:
        if int(s) in request["ignored"]:
            signal.signal(s, signal.SIG_IGN)
        elif s == signal.SIGINT:
            signal.signal(s, signal.default_int_handler)
        else:
            signal.signal(s, signal.SIG_DFL)
    released = os.read(go, 1)
    os.close(go)
    if not released:  # the job's process ended first; the server kills this fork
        os._exit(1)
    # the server forked with these blocked: a signal passed on before here arrives now
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    sys.argv[:] = request["argv"]
    sys.path[:] = request["path"]
    _new_stdio(request["unbuffered"])
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    _finalize()
    return status


def _finalize() -> None:
    """What Python does at exit and ``os._exit`` skips: wait for the threads that are not
    daemons (``threading._shutdown``, as ``Py_FinalizeEx`` does), run the ``atexit``
    functions (the job's own and those of the modules that the server imported, which a
    process of its own runs too: ``logging.shutdown`` among them), flush the streams."""
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


@dataclass
class _Job:
    """A forked job: its process, its pidfd, its job's connection (None once closed) and
    the pipe that releases the fork (:data:`READY`; None once written or closed)."""

    pid: int
    pidfd: int
    conn: socket.socket | None
    go: int | None = None


@dataclass
class Server:
    """The server's state: its listening socket, the selector it waits on, and the running
    jobs by pidfd."""

    listener: socket.socket
    selector: selectors.DefaultSelector = field(default_factory=selectors.DefaultSelector)
    jobs: dict[int, _Job] = field(default_factory=dict)
    served: int = 0

    def serve_forever(self) -> None:
        """Accept jobs, fork them, pass on their signals and send their statuses, until
        SIGTERM (:class:`_Stop`)."""
        self.listener.setblocking(True)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    self._accept()
                elif key.data[0] == "exit":
                    self._reap(key.data[1])
                else:
                    self._signal(key.data[1])

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        try:
            header, fds, _flags, _addr = socket.recv_fds(conn, HEADER.size, 3)
            if len(header) < HEADER.size or len(fds) != 3:
                raise OSError("an incomplete request")
            (size,) = HEADER.unpack(header)
            request = json.loads(recv_exactly(conn, size))
        except (OSError, ValueError) as err:
            print(f"crosslip job server: a bad request ({err})", file=sys.stderr)
            conn.close()
            return
        reason = _refusal(request, {job.pid for job in self.jobs.values()})
        if reason is not None:
            with contextlib.suppress(OSError):
                conn.sendall(REFUSED + reason.encode())
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        server = os.getpid()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the fork is the job
        go_read, go = os.pipe()
        pid = os.fork()
        if pid != 0:
            # the fork's group exists before any signal is passed on to it (the fork sets it
            # too, whichever runs first)
            os.setpgid(pid, pid)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(go_read)
        else:  # the fork: never returns into the server
            status = 1
            try:
                os.setpgid(0, 0)
                _die_with_parent(signal.SIGKILL)
                if os.getppid() != server:  # the server died before the line above
                    os._exit(1)
                self._close_in_fork(conn)
                os.close(go)
                status = _run_job(request, fds, go_read)
            except KeyboardInterrupt:  # Ctrl-C passed on before the script ran
                traceback.print_exc()
                status = -signal.SIGINT
            except BaseException:
                traceback.print_exc()
            finally:
                if status < 0:
                    end_by(-status)
                os._exit(status if status >= 0 else 1)
        for fd in fds:
            os.close(fd)
        self.served += 1
        conn.settimeout(None)
        pidfd = os.pidfd_open(pid)
        job = _Job(pid, pidfd, conn, go)
        self.jobs[pidfd] = job
        self.selector.register(pidfd, selectors.EVENT_READ, ("exit", pidfd))
        self.selector.register(conn, selectors.EVENT_READ, ("signal", pidfd))
        try:
            conn.sendall(ACCEPTED)
        except OSError:
            self._drop(job, signal.SIGKILL)

    def _close_in_fork(self, keep: socket.socket) -> None:
        """In a fork: close what belongs to the server (its socket, its selector and the
        connections of the other jobs)."""
        for job in self.jobs.values():
            if job.conn is not None:
                job.conn.close()
            if job.go is not None:
                os.close(job.go)
            os.close(job.pidfd)
        self.selector.close()
        self.listener.close()
        keep.close()

    def _signal(self, pidfd: int) -> None:
        """Pass on the signals that the job's process sent; on its end, kill the fork."""
        job = self.jobs.get(pidfd)
        if job is None or job.conn is None:  # ended in the same wake-up
            return
        try:
            data = job.conn.recv(64)
        except OSError:
            data = b""
        if not data:
            self._drop(job, signal.SIGKILL)
            return
        for signum in data:
            if signum == READY:
                self._release(job)
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.pid, signum)

    def _release(self, job: _Job) -> None:
        """Let the fork run its script (:data:`READY`): the signals passed on before this
        wait, blocked, in the fork, and end it before its first line if they end it."""
        if job.go is not None:
            with contextlib.suppress(OSError):
                os.write(job.go, b"\0")
            os.close(job.go)
            job.go = None

    def _drop(self, job: _Job, signum: int | None) -> None:
        """Close the connection to the job's process and, unless ``signum`` is None, send
        ``signum`` to its fork's process group."""
        if job.conn is not None:
            self.selector.unregister(job.conn)
            job.conn.close()
            job.conn = None
        if job.go is not None:  # a fork never released reads the end of its pipe and exits
            os.close(job.go)
            job.go = None
        if signum is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.pid, signum)

    def _reap(self, pidfd: int) -> None:
        """The fork ended: send its status (the exit status, or minus the signal that ended
        it) to the job's process."""
        job = self.jobs.pop(pidfd)
        self.selector.unregister(pidfd)
        _, wait_status = os.waitpid(job.pid, 0)
        os.close(pidfd)
        if os.WIFSIGNALED(wait_status):
            status = -os.WTERMSIG(wait_status)
        else:
            status = os.waitstatus_to_exitcode(wait_status)
        if job.conn is not None:
            with contextlib.suppress(OSError):
                job.conn.sendall(STATUS.pack(status))
            self._drop(job, None)

    def stop(self) -> None:
        """Kill the forks that still run (SIGKILL to their groups) and reap them."""
        for job in list(self.jobs.values()):
            self._drop(job, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(job.pid, 0)
            os.close(job.pidfd)
        self.jobs.clear()
        self.selector.close()
        self.listener.close()


class _Stop(Exception):
    """SIGTERM to the server."""


def _stop(_signum: int, _frame: Any) -> None:
    raise _Stop


def listen(path: str | Path) -> socket.socket:
    """A UNIX socket bound to ``path`` and listening: a job that connects from then on waits
    in its queue (up to 128) until the server accepts it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def serve(
    path: str | Path,
    preload: tuple[str, ...] | list[str] = PRELOAD,
    listener_fd: int | None = None,
) -> int:
    """Serve jobs on the UNIX socket ``path`` until SIGTERM (or until this process's parent
    dies): listen on it (or take the listening socket ``listener_fd`` that the parent bound
    there, :func:`start_server`), import ``preload``, then accept. Jobs that connect while
    it imports wait in the socket's queue. The socket file is removed at the end. Returns
    0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the jobs through their own
    signal.signal(signal.SIGTERM, _stop)
    _die_with_parent(signal.SIGTERM)
    listener = listen(path) if listener_fd is None else socket.socket(fileno=listener_fd)
    server = Server(listener)
    try:
        start = time.perf_counter()
        for name in preload:
            importlib.import_module(name)
        # What the imports made lives on in every fork: out of the collector's reach, a fork's
        # collections do not walk it (nor write to its pages, which a fork would then copy).
        gc.collect()
        gc.freeze()
        print(
            f"crosslip job server: {len(preload)} modules imported in "
            f"{time.perf_counter() - start:.1f} s; serving at {path}",
            file=sys.stderr,
        )
        server.serve_forever()
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.stop()
        print(f"crosslip job server: {server.served} jobs served", file=sys.stderr)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return 0


def start_server(
    path: str | Path, preload: tuple[str, ...] | list[str] = PRELOAD, **popen: Any
) -> subprocess.Popen:
    """Start :func:`serve` on the UNIX socket ``path`` in a new process (``popen``: more
    arguments of :class:`subprocess.Popen`, e.g. where its output goes). The socket listens
    before this returns (bound here, the server inherits it): a job that connects at once,
    while the server's Python still starts, waits in its queue instead of finding no socket
    and running in its own process."""
    listener = listen(path)
    try:
        fd = listener.fileno()
        cmd = [sys.executable, "-m", "crosslip.jobserver", "--serve", str(path)]
        cmd += ["--listener-fd", str(fd), "--preload", ",".join(preload)]
        return subprocess.Popen(cmd, pass_fds=(fd, *popen.pop("pass_fds", ())), **popen)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    finally:
        listener.close()


# --- the command -----------------------------------------------------------------------------


def run_under_server(command: list[str], preload: tuple[str, ...] | list[str] = PRELOAD) -> int:
    """Run ``command`` with a job server for its jobs (:data:`ENV` names its socket) and
    return its exit status (128 + N if a signal N ended it). SIGINT (Ctrl-C, which the
    terminal sends to the command too) is ignored here while the command runs; SIGTERM and
    SIGHUP are passed on to it. Without :func:`supported`, where the socket's path would
    be too long, or where no socket can be made there, the command runs without a server (a
    message says so)."""
    folder = tempfile.mkdtemp(prefix="crosslip-forkserver-")
    path = os.path.join(folder, "socket")
    server = None
    env = dict(os.environ)
    try:
        if not supported():
            print(f"crosslip: no job server on {sys.platform}; jobs start alone", file=sys.stderr)
        elif len(os.fsencode(path)) > MAX_SOCKET_PATH:
            print(
                f"crosslip: no job server: the socket path {path} is longer than "
                f"{MAX_SOCKET_PATH} bytes (set TMPDIR to a shorter folder)",
                file=sys.stderr,
            )
        else:
            try:
                server = start_server(path, preload)
            except OSError as err:  # e.g. a temporary folder that takes no sockets
                print(
                    f"crosslip: no job server: cannot listen on {path} ({err}); jobs start alone",
                    file=sys.stderr,
                )
            else:
                env[ENV] = path
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as err:
            print(f"crosslip: cannot run {command[0]!r}: {err}", file=sys.stderr)
            return 127
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, lambda signum, _frame: child.send_signal(signum))
        try:
            code = child.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return code if code >= 0 else 128 - code
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crosslip.jobserver",
        description="Run a command (Snakemake) whose jobs fork from a job server that has "
        "imported torch and crosslip once: python -m crosslip.jobserver -- snakemake "
        "--cores all. With --serve SOCKET, run the server alone.",
    )
    parser.add_argument("--serve", metavar="SOCKET", help="run the server alone on SOCKET")
    parser.add_argument(
        "--listener-fd",
        type=int,
        metavar="FD",
        help="with --serve: the inherited socket already listening on SOCKET (start_server)",
    )
    parser.add_argument(
        "--preload", default=",".join(PRELOAD), help="the modules to import, comma-separated"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    preload = [m for m in args.preload.split(",") if m]
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.listener_fd is not None and not args.serve:
        parser.error("--listener-fd goes with --serve SOCKET")
    if args.serve:
        if command:
            parser.error("--serve runs the server alone: give no command")
        return serve(args.serve, preload, args.listener_fd)
    if not command:
        parser.error("give a command to run, e.g. -- snakemake --cores all")
    return run_under_server(command, preload)

"""A job's side of the job server (:mod:`crosslip.jobserver.server`): hand a workflow script
to the server, which runs it in a fork that has imported torch, pandas and crosslip's stages
once, and wait for that fork as if the script ran here.

Under a server (:data:`ENV` set: ``python -m crosslip.jobserver -- snakemake ...``, which
``make run`` runs), a workflow script hands itself off in
:func:`crosslip.io.scripts.run_script` (:func:`hand_off`), after Snakemake's preamble: the
fork runs the script from there, so it is the same code as a job in its own process, minus
the imports. ``python -m crosslip.jobserver.handoff SCRIPT`` (:func:`main`) does the same
before the script's first line, for a caller that starts scripts itself. Where the server
cannot take the job, the job runs in its own process, as Snakemake started it. This module
imports nothing beyond the standard library's sockets, signals and JSON: it is what each
served job's process loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from typing import Any

#: The environment variable that names the server's socket for the jobs of a run.
ENV = "CROSSLIP_FORKSERVER"

#: The signals that a served job's process passes on to its fork.
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTSTP,
    signal.SIGCONT,
)

#: A batch system's job id: a job that runs in a batch job runs where that job's limits and
#: accounting apply, never in a server outside it (SLURM, PBS/Torque, LSF, Grid Engine).
BATCH_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")

#: The server's replies to a request: it forks the job, or refuses it (a reason follows).
ACCEPTED, REFUSED = b"A", b"R"

#: What a job's process sends once it has passed on the signals that came before its fork
#: was known: the server then lets the fork run the script (every other byte is a signal).
READY = 0

#: A request's header (the length of its JSON) and the fork's exit status, on the socket.
HEADER = struct.Struct("!I")
STATUS = struct.Struct("!i")

#: True in a fork of the server (:func:`enter_fork`): its :func:`hand_off` runs the job there.
_IN_FORK = False


def enter_fork() -> None:
    """Mark this process as a fork of the server, which runs its job itself: from now on
    :func:`hand_off` returns at once."""
    global _IN_FORK
    _IN_FORK = True


def supported() -> bool:
    """Whether this platform can run the server: Linux, for ``os.pidfd_open``, fork and
    ``PR_SET_PDEATHSIG``."""
    return sys.platform == "linux" and hasattr(os, "pidfd_open")


def identity() -> dict[str, str]:
    """What must be the same in the server and a job it runs: the interpreter, the
    environment's prefix and the crosslip package imported."""
    import crosslip

    return {
        "python": os.path.realpath(sys.executable),
        "prefix": os.path.realpath(sys.prefix),
        "crosslip": os.path.realpath(os.path.dirname(crosslip.__file__)),
    }


def _request(ignored: list[int], mask: set[signal.Signals]) -> dict[str, Any]:
    """What a fork needs to be this process: ``sys.argv``, ``sys.path``, working folder,
    environment, umask, the signals this process ignores and blocks, and
    :func:`identity`."""
    umask = os.umask(0)
    os.umask(umask)
    return {
        "argv": list(sys.argv),
        "path": list(sys.path),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "umask": umask,
        "ignored": ignored,
        "blocked": sorted(int(sig) for sig in mask),
        "unbuffered": bool(getattr(sys.stdout, "write_through", False)),
        "identity": identity(),
        "pid": os.getpid(),
    }


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``, or fewer if it closes first."""
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def hand_off() -> None:
    """Run this script in a fork of the job server named by :data:`ENV`, and exit as that
    fork exits; return (run here) if no server is named, in a fork of the server, or when
    the server cannot take the job (a message on stderr says why, except when none is
    named). Call it before the script imports anything heavy:
    :func:`crosslip.io.scripts.run_script` does, so a workflow script imports torch, pandas
    and crosslip's stages in ``main()``.

    The fork runs ``sys.argv[0]`` from its first line as ``__main__``; this process waits,
    passes on the signals of :data:`FORWARDED`, then exits with the fork's exit status or
    is ended by the signal that ended the fork."""
    address = os.environ.get(ENV)
    if not address or _IN_FORK or not supported():
        return
    script = sys.argv[0] if sys.argv else ""
    if not script or not os.path.isfile(script):
        return
    ignored = [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]
    # A signal that comes before the fork is known waits (blocked) until this process either
    # passes it on or, running the job itself, takes it as it would have.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(address)
            payload = json.dumps(_request(ignored, mask)).encode()
            socket.send_fds(sock, [HEADER.pack(len(payload))], [0, 1, 2])
            sock.sendall(payload)
            reply = recv_exactly(sock, 1)
        except OSError as err:
            sock.close()
            print(
                f"crosslip: the job server {address} ({ENV}) is not reachable ({err}); "
                "this job runs in its own process",
                file=sys.stderr,
            )
            return
        if reply != ACCEPTED:
            reason = sock.recv(4096).decode(errors="replace") if reply == REFUSED else "no reply"
            sock.close()
            print(
                f"crosslip: the job server {address} ({ENV}) did not take this job: {reason}; "
                "it runs in its own process",
                file=sys.stderr,
            )
            return
        _install_forwarders(sock, ignored)
        # the fork waits, its signals blocked, for READY: what came before it was known
        # reaches it before its script runs, as it would have ended a process of its own
        early = _take_pending(set(ignored) | {int(s) for s in mask})
        with contextlib.suppress(OSError):  # a server gone: _wait_for_fork says so
            sock.sendall(bytes([*early, READY]))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    _wait_for_fork(sock)


def _take_pending(kept: set[int]) -> list[int]:
    """Take (``sigtimedwait``, without running a handler) the signals of :data:`FORWARDED`
    that wait, blocked, in this process, except those in ``kept`` (ignored, or blocked by
    the process itself); their numbers, in the order of :data:`FORWARDED`."""
    pending = {int(s) for s in signal.sigpending()}
    taken = []
    for s in FORWARDED:
        if int(s) in pending and int(s) not in kept and signal.sigtimedwait([s], 0) is not None:
            taken.append(int(s))
    return taken


def _install_forwarders(sock: socket.socket, ignored: list[int]) -> None:
    """Pass on the signals of :data:`FORWARDED` that this process does not ignore."""

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            sock.send(bytes([signum]))

    for s in FORWARDED:
        if int(s) not in ignored:
            signal.signal(s, forward)


def _wait_for_fork(sock: socket.socket) -> None:
    """Wait for the fork's status from the server, then exit with it."""
    data = recv_exactly(sock, STATUS.size)
    if len(data) < STATUS.size:  # the server died: its forks die with it
        print(f"crosslip: the job server {os.environ.get(ENV)} ended", file=sys.stderr)
        os._exit(1)
    (status,) = STATUS.unpack(data)
    if status < 0:
        end_by(-status)
        os._exit(128 - status)
    os._exit(status)


def end_by(signum: int) -> None:
    """End this process by ``signum``, as the fork it waited for ended."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def main(argv: list[str] | None = None) -> None:
    """``python -m crosslip.jobserver.handoff SCRIPT [ARG ...]``: ``python SCRIPT [ARG
    ...]``, run in a fork of the job server where it takes the job (this process waits,
    passes on signals and exits as the fork does), and in this process otherwise: it
    becomes ``python SCRIPT [ARG ...]`` (``exec``) without :data:`ENV`, as the job would
    have started without the server. ``sys.argv`` and ``sys.path[0]`` are set as ``python
    SCRIPT`` sets them."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m crosslip.jobserver.handoff SCRIPT [ARG ...]", file=sys.stderr)
        sys.exit(2)
    sys.argv[:] = args
    sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
    hand_off()  # returns only where this process runs the script itself
    env = {k: v for k, v in os.environ.items() if k != ENV}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *args], env)


if __name__ == "__main__":
    main()

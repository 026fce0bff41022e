"""A gate in front of the tests' job server: it holds a run's jobs until the test lets them go.

A run whose environment names the gate's socket as its job server
(:data:`crosslip.forkserver.ENV`) starts each workflow script as ``python -m crosslip.handoff
SCRIPT`` (:func:`crosslip.handoff.serve_script_jobs`), and that process waits for the
server's reply before the script's first line. The gate takes each such request and gives
no reply, so the job stays started and unfinished, its run alive and holding its locks, for
as long as the test needs, on any machine: nothing depends on how fast the run is.

:meth:`JobGate.release` then answers each held job with a refusal (the job runs in its own
process, as under no server; ``crosslip.handoff`` writes one line on stderr that says so)
and puts the session's job server in the socket's place (a symbolic link, replaced
atomically), so that the run's later jobs fork from it as usual. Without a session server,
the socket goes and the later jobs run in their own processes too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from crosslip import forkserver
from crosslip.handoff import HEADER, REFUSED, recv_exactly

#: Why the gate refuses a job it held (crosslip.handoff prints it on the job's stderr).
REASON = "the test held this job at its start"


class JobGate:
    """A Unix socket, in a folder of its own under the temporary folder (a socket's path
    has at most 107 bytes), that speaks the job server's side of :mod:`crosslip.handoff`
    only so far as to hold its callers; :attr:`env` is the environment of a run whose jobs
    it holds. The folder goes at :meth:`close` (the context's end, after the run), which
    releases what is still held."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="crosslip-gate-"))
        self.path = self.folder / "socket"
        self.server = os.environ.get(forkserver.ENV) or None  # the session's, if any
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen()
        self.held: list[tuple[socket.socket, dict[str, Any]]] = []
        self.env = {**os.environ, forkserver.ENV: str(self.path)}

    def wait(self, *procs: subprocess.Popen, timeout: float = 300) -> dict[str, Any]:
        """Hold the next job that hands itself off, and return its request (``argv``,
        ``pid``, ``cwd``, …: :func:`crosslip.handoff._request`). Fails if every one of
        ``procs`` (the runs that may start it) has ended first, or after ``timeout``."""
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
        header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
        for fd in fds:  # the job's stdin, stdout and stderr: kept, they would hold its
            os.close(fd)  # run's pipes open after its end
        header += recv_exactly(conn, HEADER.size - len(header))
        (size,) = HEADER.unpack(header)
        request = json.loads(recv_exactly(conn, size))
        self.held.append((conn, request))
        return request

    def let_go(self, request: dict[str, Any]) -> None:
        """Let one held job go (the one ``request`` came from): it runs in its own process."""
        for held in [h for h in self.held if h[1] is request]:
            self.held.remove(held)
            self._refuse(held[0])

    def release(self) -> None:
        """Let every held job go (it runs in its own process), and the run's later jobs
        to the session's job server (or, with none, to their own processes)."""
        if self.server:
            link = self.path.with_name("socket.link")
            link.symlink_to(self.server)
            os.replace(link, self.path)
        else:
            self.path.unlink(missing_ok=True)
        self.listener.close()
        while self.held:
            self._refuse(self.held.pop()[0])

    @staticmethod
    def _refuse(conn: socket.socket) -> None:
        """The server's refusal (a job killed while held has gone: nothing to answer)."""
        with contextlib.suppress(OSError):
            conn.sendall(REFUSED + REASON.encode())
        conn.close()

    def close(self) -> None:
        if self.listener.fileno() >= 0:
            self.release()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> JobGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""A run lock that the operating system releases when its holder dies, so that a killed run
resumes with the same command.

Snakemake locks a working directory with files under ``.snakemake/locks`` that a run writes
after building its DAG and deletes when it ends. A run killed with SIGKILL (a lost login
node, an OOM kill of Snakemake itself, a power cut) leaves them behind, and the next run
stops with ``LockException`` until someone runs ``--unlock``, which deletes them whether or
not their run is still alive.

Here the main Snakemake process of a run holds, from the moment it parses the Snakefile until
it exits, two ``fcntl.flock`` locks on files under ``.snakemake/crosslip-runlock/``. The
kernel drops a flock when the last descriptor of its open file closes, i.e. when the holder
exits, whatever the cause (on NFS, where flock is emulated by POSIX locks, when the lost
client's lease expires, about 90 s for NFSv4):

* ``run-<results folder>.lock``, exclusive: a second run for the same results folder stops
  at once with :class:`RunLockBusy`, naming the live run (pid, host, start, command). The
  file keeps a one-line JSON record of its last holder.
* ``workdir.lock``, shared by every run. A run that can take it exclusively knows that no
  run of this workflow is alive in the working directory: the Snakemake lock files that a
  run here left when it died are then stale, and are removed (:func:`stale_snakemake_locks`).
  Snakemake parses the Snakefile before it reads its lock files (``Workflow.execute``:
  ``_prepare_dag``, ``_build_dag``, then ``persistence.lock()``), so they are gone by then.

A Snakemake lock file is removed only if (1) no run of this workflow is alive here (the
exclusive flock proves it) and (2) it is not older than the start of a run that never
recorded its end (a run that was killed; the record is written once the run holds
``workdir.lock``, the comparison uses file mtimes, i.e. the file system's clock): a lock
file of some other Snakemake process, or of a run before this module existed, is left to
Snakemake, which then refuses as before. A run that ends (success, failure, Ctrl-C,
SIGTERM) records its end at exit; a killed run's record is marked used once its lock files
are removed, so that it vouches for no later one.

:func:`guard_run` is the entry point for the Snakefile. It acts only in the main process of
a command that runs jobs or changes the working directory; dry runs (``-n``), ``--unlock``,
``--nolock``, ``--lint``, ``--report``, ``--summary`` and the other read-only commands, and the
job processes that Snakemake starts (``--mode subprocess`` / ``remote``, e.g. every SLURM
job, which parses the Snakefile again on its node) neither take nor break the lock.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import fcntl
import hashlib
import json
import os
import re
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Where the lock files live, relative to the working directory.
STATE_DIR = Path(".snakemake") / "crosslip-runlock"
#: Snakemake's own lock files (its file persistence backend), relative to the working dir.
SNAKEMAKE_LOCKS = Path(".snakemake") / "locks"
_SNAKEMAKE_LOCK_NAME = re.compile(r"[0-9]+\.(input|output)\.lock")
#: How long a run waits for another one's removal of stale locks (it holds the workdir lock
#: exclusively for a few milliseconds) before giving up.
SHARED_WAIT_S = 60.0

#: Commands of the Snakemake command line that only read the working directory: they take
#: no lock (Snakemake itself only warns about a lock for most of them). Any other command
#: (a run, --touch, --delete-all-output, --cleanup-metadata, ...) takes it.
READ_ONLY_ACTIONS = (
    "dryrun",
    "lint",
    "list_target_rules",
    "list_rules",
    "print_compilation",
    "dag",
    "rulegraph",
    "filegraph",
    "d3dag",
    "summary",
    "detailed_summary",
    "list_changes",
    "list_input_changes",
    "list_params_changes",
    "list_untracked",
    "list_conda_envs",
    "archive",
    "generate_unit_tests",
    "unlock",
    "nolock",
)


class RunLockBusy(Exception):
    """Another live run holds the lock of the same results folder."""


class RunLockUnsupported(Exception):
    """The file system refuses flock (e.g. Lustre mounted without ``flock``)."""


@dataclass
class Holder:
    """The record a run writes into its results folder's lock file."""

    pid: int | None = None
    host: str = "?"
    started: str = "?"
    command: str = "?"
    results: str = "?"
    ended: bool = False
    #: When the record was written (the file's mtime: the file system's clock, as for the
    #: Snakemake lock files it is compared with).
    written: float = 0.0
    path: Path | None = None

    def describe(self) -> str:
        return (
            f"Snakemake pid {self.pid if self.pid is not None else '?'} on host {self.host}, "
            f"started {self.started}, command: {self.command}"
        )


@dataclass
class RunLock:
    """The locks held by a live run (keep the object alive: closing its files releases them)."""

    results_fd: int
    workdir_fd: int
    record_path: Path
    holder: Holder
    #: Stale Snakemake lock files removed when it was taken, and the killed runs they were
    #: left by.
    removed: list[Path] = field(default_factory=list)
    killed: list[Holder] = field(default_factory=list)
    #: Snakemake lock files found but not proven stale (older than any killed run).
    kept: list[Path] = field(default_factory=list)
    #: Snakemake lock files left alone because another run of this workflow is alive here.
    unchecked: list[Path] = field(default_factory=list)

    def release(self) -> None:
        """Record the end of the run and drop both locks (also done by the kernel at exit)."""
        if self.results_fd < 0:
            return
        self.holder.ended = True
        _write_record(self.results_fd, self.holder)
        os.close(self.results_fd)
        os.close(self.workdir_fd)
        self.results_fd = self.workdir_fd = -1


def results_lock_path(workdir: Path, results: str | Path) -> Path:
    """``<workdir>/.snakemake/crosslip-runlock/run-<readable name>-<hash>.lock`` for a results
    folder (relative to ``workdir`` or absolute); the hash is of its absolute path."""
    folder = Path(os.path.abspath(Path(workdir) / results))
    try:
        shown = str(folder.relative_to(os.path.abspath(workdir)))
    except ValueError:
        shown = str(folder)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", shown).strip("_")[:80] or "root"
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:8]
    return Path(workdir) / STATE_DIR / f"run-{name}-{digest}.lock"


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _flock(fd: int, how: int, path: Path) -> bool:
    """flock; False where another process holds a conflicting lock (LOCK_NB)."""
    try:
        fcntl.flock(fd, how)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise RunLockUnsupported(f"cannot flock {path}: {e.strerror} (errno {e.errno})") from e


def _write_record(fd: int, holder: Holder) -> None:
    data = {k: getattr(holder, k) for k in ("pid", "host", "started", "command", "results")}
    data["ended"] = holder.ended
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(data) + "\n").encode(), 0)


def read_record(path: Path) -> Holder:
    """The record in a results folder's lock file; fields ``?`` where it is empty or torn
    (its holder may be writing it right now)."""
    try:
        text, written = path.read_text(), path.stat().st_mtime
    except OSError:
        return Holder(path=path)
    try:
        data: dict[str, Any] = json.loads(text)
        fields = {k: data[k] for k in ("pid", "host", "started", "command", "results", "ended")}
        return Holder(**fields, written=written, path=path)
    except (ValueError, KeyError, TypeError):
        return Holder(path=path, written=written)


def snakemake_lock_files(workdir: Path) -> list[Path]:
    folder = Path(workdir) / SNAKEMAKE_LOCKS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _SNAKEMAKE_LOCK_NAME.fullmatch(p.name))


def stale_snakemake_locks(workdir: Path) -> tuple[list[Path], list[Path], list[Holder]]:
    """``(stale, kept, killed)``: Snakemake's lock files not older than the start of a run
    that never recorded its end (``killed``), and the others (``kept``). Only meaningful
    while the caller holds ``workdir.lock`` exclusively: then no run of this workflow is
    alive here, and none is between taking its lock and writing its record (it writes its
    record only once it holds ``workdir.lock``)."""
    records = sorted((Path(workdir) / STATE_DIR).glob("run-*.lock"))
    killed = [h for h in map(read_record, records) if h.pid is not None and not h.ended]
    stale, kept = [], []
    since = min((h.written for h in killed), default=None)
    for lock in snakemake_lock_files(workdir):
        try:
            mtime = lock.stat().st_mtime
        except FileNotFoundError:
            continue
        (stale if since is not None and mtime >= since else kept).append(lock)
    return stale, kept, killed


def _alive(holder: Holder) -> bool:
    """Whether a record's run may be alive (False only if its pid on this host is gone, or
    the record says that it ended)."""
    if holder.pid is None or holder.ended:
        return False
    if holder.host != socket.gethostname():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _busy_message(results: str | Path, workdir: Path, record_path: Path) -> str:
    other = read_record(record_path)
    for _ in range(40):  # the holder writes its record a moment after taking the lock
        if _alive(other):
            break
        time.sleep(0.05)
        other = read_record(record_path)
    return (
        f"another run is writing to the results folder {str(results)!r} of "
        f"{os.path.abspath(workdir)} ({other.describe()}). It is alive (a killed run "
        "holds no lock): wait for it to end or stop it, then run the same command again."
    )


def acquire(workdir: Path | str, results: str | Path, command: str) -> RunLock:
    """Take the locks of a run writing to ``results`` (relative to ``workdir`` or absolute)
    and remove the Snakemake lock files that a killed run left (see the module docstring).
    Raises :class:`RunLockBusy` if a live run holds the results folder, with a one-line
    message naming it, and :class:`RunLockUnsupported` where flock does not work."""
    workdir = Path(workdir)
    record_path = results_lock_path(workdir, results)
    workdir_path = workdir / STATE_DIR / "workdir.lock"
    results_fd = _open(record_path)
    workdir_fd = -1
    try:
        if not _flock(results_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, record_path):
            raise RunLockBusy(_busy_message(results, workdir, record_path))
        workdir_fd = _open(workdir_path)
        lock = RunLock(results_fd, workdir_fd, record_path, Holder())
        # Exclusive: no run of this workflow is alive here, and the lock files of killed runs
        # are stale. Shared: other runs are alive (their lock files are left alone). Neither,
        # for a moment: another process is removing stale lock files, or probing.
        deadline = time.monotonic() + SHARED_WAIT_S
        while True:
            if _flock(workdir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, workdir_path):
                stale, lock.kept, lock.killed = stale_snakemake_locks(workdir)
                for path in stale:
                    path.unlink(missing_ok=True)
                    lock.removed.append(path)
                for h in lock.killed:  # used up: they vouch for no later lock file
                    h.ended = True
                    _rewrite(h)
                # Not atomic: another run may take the lock exclusively in between and
                # remove lock files; those are of dead runs (this one writes none before
                # Snakemake has parsed the Snakefile).
                fcntl.flock(workdir_fd, fcntl.LOCK_SH)
                break
            if _flock(workdir_fd, fcntl.LOCK_SH | fcntl.LOCK_NB, workdir_path):
                lock.unchecked = snakemake_lock_files(workdir)
                break
            if time.monotonic() > deadline:
                raise RunLockUnsupported(
                    f"{workdir_path} stayed locked exclusively for {SHARED_WAIT_S:g} s"
                )
            time.sleep(0.05)
        lock.holder = Holder(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.strftime("%Y-%m-%d %H:%M:%S %z"),
            command=command,
            results=str(results),
        )
        _write_record(results_fd, lock.holder)
    except BaseException:
        os.close(results_fd)
        if workdir_fd >= 0:
            os.close(workdir_fd)
        raise
    return lock


def _rewrite(holder: Holder) -> None:
    assert holder.path is not None
    fd = os.open(holder.path, os.O_RDWR)
    try:
        _write_record(fd, holder)
    finally:
        os.close(fd)


def probe_stale(workdir: Path | str) -> tuple[list[Path], list[Holder]]:
    """For read-only commands: the Snakemake lock files that the next run will remove as
    stale, and the killed runs that left them; ``([], [])`` while a run is alive. Holds the
    workdir lock exclusively for a moment only, and changes nothing."""
    workdir = Path(workdir)
    if not snakemake_lock_files(workdir):
        return [], []
    path = workdir / STATE_DIR / "workdir.lock"
    fd = _open(path)
    try:
        if not _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path):
            return [], []
        stale, _, killed = stale_snakemake_locks(workdir)
        return stale, killed
    finally:
        os.close(fd)


def takes_lock(args: argparse.Namespace) -> bool:
    """Whether a command line runs jobs or changes the working directory (see
    :data:`READ_ONLY_ACTIONS`); ``--report`` without ``--report-after-run`` only reads."""
    if any(getattr(args, name, None) for name in READ_ONLY_ACTIONS):
        return False
    return not (getattr(args, "report", None) and not getattr(args, "report_after_run", False))


#: The lock of this process, kept open for its lifetime.
_HELD: list[RunLock] = []


def guard_run(results: str | Path) -> None:
    """Called by the Snakefile at parse time, with the results folder of the config. In the
    main Snakemake process of a run (its command line read by
    :func:`.snakemake_internals.command_line`): take the run lock (raising
    ``WorkflowError`` with :class:`RunLockBusy`'s message if another run holds it) and remove
    the Snakemake lock files of a killed run; for a read-only command, say whether the lock
    files it finds are stale. Anything else (job processes, the Python API) is left alone."""
    from snakemake.exceptions import WorkflowError
    from snakemake.logging import logger
    from snakemake.settings.enums import PersistenceBackend

    from .snakemake_internals import command_line, is_main_process

    args = command_line()
    if args is None or not is_main_process(args) or _HELD:
        return
    workdir = Path.cwd()
    try:
        if not takes_lock(args):
            if getattr(args, "dryrun", False):
                stale, killed = probe_stale(workdir)
                if stale:
                    logger.warning(
                        f"crosslip: the Snakemake lock files in {SNAKEMAKE_LOCKS} were left by "
                        f"a killed run ({killed[0].describe()}); the next run removes them, "
                        "no --unlock needed."
                    )
            return
        if getattr(args, "persistence_backend", None) not in (None, PersistenceBackend.FILE):
            logger.warning(
                "crosslip: stale Snakemake locks are removed only for the file persistence "
                "backend; after a killed run use --unlock."
            )
        command = shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]])
        lock = acquire(workdir, results, command)
    except RunLockBusy as e:
        raise WorkflowError(f"crosslip: {e}") from None
    except RunLockUnsupported as e:
        logger.warning(
            f"crosslip: no run lock ({e}); Snakemake's own lock applies: after a killed run, "
            "run the command once with --unlock."
        )
        return
    _HELD.append(lock)
    atexit.register(lock.release)
    for h in lock.killed:
        logger.warning(f"crosslip: resuming after a killed run ({h.describe()}).")
    if lock.removed:
        logger.warning(
            f"crosslip: removed {len(lock.removed)} stale Snakemake lock file(s) in "
            f"{SNAKEMAKE_LOCKS}: the run that wrote them is dead (no --unlock needed)."
        )
    if lock.unchecked:
        logger.warning(
            f"crosslip: another run of this workflow is alive in this working directory, so "
            f"the Snakemake lock files in {SNAKEMAKE_LOCKS} are left alone; if Snakemake "
            "refuses to start (LockException), wait for that run to end, then run the same "
            "command again (--unlock would remove that run's lock files too)."
        )
    if lock.kept:
        logger.warning(
            f"crosslip: {len(lock.kept)} Snakemake lock file(s) in {SNAKEMAKE_LOCKS} were not "
            "left by a killed run of this workflow and are kept; if Snakemake refuses to start "
            "and no other Snakemake runs in this folder, run once with --unlock."
        )

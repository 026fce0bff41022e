"""The job server (crosslip.jobserver): a job that its server runs is the same process
as one that runs alone (argv, working folder, environment, umask, sys.path, standard streams,
exit status), only forked; signals reach the fork; a killed job's process or server leaves
no fork behind; a job that the server cannot take runs alone and says why. Real processes
and a real UNIX socket; the server imports only what these scripts need."""

from __future__ import annotations

import ast
import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from crosslip.jobserver import handoff
from crosslip.jobserver import server as job_server

from .helpers import ROOT, SERVED_SNAKEMAKE, SNAKEMAKE, snakemake_cmd, without_stamps
from .test_interruptions import interruptible

pytestmark = pytest.mark.skipif(not job_server.supported(), reason="the server needs Linux")

#: A workflow-like script: run_script hands it off; main() writes what it sees, then acts.
#: Its first lines add the process's id to the file ``ran`` beside it: they run in the job's
#: process and again in the fork when run_script hands it off, only in the fork when
#: ``python -m crosslip.jobserver.handoff`` does (as Snakemake's preamble then runs only
#: there).
SCRIPT = textwrap.dedent(
    """
    import gc, json, os, signal, sys, time
    from pathlib import Path
    with open(Path(__file__).with_name("ran"), "a") as ran:
        ran.write(f"{os.getpid()}\\n")
    from crosslip.io import run_script

    def main():
        out, mode = Path(sys.argv[1]), sys.argv[2]
        try:  # from before the facts are written: the test signals once it reads them
            umask = os.umask(0)
            os.umask(umask)
            facts = {
                "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                "cwd": os.getcwd(), "argv": sys.argv, "probe": os.environ.get("PROBE"),
                "umask": umask, "path0": sys.path[0], "name": __name__,
                "torch": "torch" in sys.modules, "named": "CROSSLIP_FORKSERVER" in os.environ,
                "frozen": gc.get_freeze_count(),
                "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
            }
            out.with_suffix(".tmp").write_text(json.dumps(facts))
            out.with_suffix(".tmp").rename(out)
            print("out:", sys.argv[2])
            print("err:", sys.argv[2], file=sys.stderr)
            if mode == "exit3":
                sys.exit(3)
            if mode == "error":
                raise ValueError("boom")
            if mode in ("sleep", "sigint"):
                time.sleep(120)
        except KeyboardInterrupt:
            out.with_name("interrupted").write_text("yes")
            sys.exit(7)

    run_script(sys.argv[3], main)
    """
)

#: Generous: the events waited for take milliseconds; the deadline only ends a broken test.
DEADLINE = 60.0


def wait_until(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"waited {DEADLINE} s for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A job server on a socket in ``tmp_path`` that imports crosslip.io only."""
    path = str(tmp_path / "socket")
    proc = job_server.start_server(path, ["crosslip.io"], stderr=subprocess.PIPE, text=True)
    yield path, proc
    proc.terminate()
    proc.wait(timeout=DEADLINE)


#: How a job's script starts: as Snakemake starts it, and through the hand-off module (for a
#: caller that starts scripts itself).
STARTS = {
    "python SCRIPT": [],
    "python -m crosslip.jobserver.handoff SCRIPT": ["-m", "crosslip.jobserver.handoff"],
}


def start_job(
    tmp_path: Path,
    mode: str,
    socket: str | None,
    name: str = "job",
    sigint: bool = True,
    start: str = "python SCRIPT",
    more_env: dict[str, str] | None = None,
):
    """The script in its own folder, run as Snakemake runs a job (``start``: ``python file
    args``, or through the hand-off); SIGINT at its default action (Ctrl-C), or ignored
    (``sigint=False``: a background job of a non-interactive shell); ``more_env``: more
    environment variables."""
    folder = tmp_path / name
    folder.mkdir()
    script = folder / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != job_server.ENV}
    env["PROBE"] = f"probe-{name}"
    env.update(more_env or {})
    if socket is not None:
        env[job_server.ENV] = socket
    out = folder / "facts.json"
    proc = subprocess.Popen(
        [sys.executable, *STARTS[start], str(script), str(out), mode, str(folder / "job.log")],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        umask=0o027,
        preexec_fn=interruptible if sigint else ignore_sigint,
    )
    return proc, out


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def facts_of(out: Path) -> dict:
    wait_until(out.exists, f"{out}")
    return json.loads(out.read_text())


def ran_in(out: Path) -> list[int]:
    """The processes that ran the first lines of the script that wrote ``out``."""
    return [int(pid) for pid in out.with_name("ran").read_text().split()]


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize(("mode", "sigint"), [("plain", True), ("exit3", False), ("error", True)])
def test_a_served_job_sees_what_it_sees_alone_and_exits_the_same(
    tmp_path, server, mode, sigint, start
):
    path, srv = server
    alone, alone_out = start_job(tmp_path, mode, None, "alone", sigint)
    served, served_out = start_job(tmp_path, mode, path, "served", sigint, start)
    results = {}
    for key, (proc, out) in {"alone": (alone, alone_out), "served": (served, served_out)}.items():
        stdout, stderr = proc.communicate(timeout=DEADLINE)
        results[key] = (proc, facts_of(out), stdout, stderr)
    (p1, a, out1, err1), (p2, s, out2, err2) = results["alone"], results["served"]
    assert p1.returncode == p2.returncode == {"plain": 0, "exit3": 3, "error": 1}[mode]
    assert out1 == out2 == f"out: {mode}\n"
    # run_script logs an error to stderr too, with its time: compare without it
    err1 = err1.replace("/alone/", "/served/")
    assert [ln[24:] for ln in err1.splitlines()[1:]] == [ln[24:] for ln in err2.splitlines()[1:]]
    assert err1.startswith(f"err: {mode}\n") and err2.startswith(f"err: {mode}\n")
    assert ("ValueError: boom" in err2) == (mode == "error")
    # the same process, seen from inside, but for where it came from
    assert s["argv"] == [arg.replace("/alone/", "/served/") for arg in a["argv"]]
    assert (a["umask"], a["name"]) == (s["umask"], s["name"])
    assert a["sigint_ignored"] == s["sigint_ignored"] == (not sigint)  # as the process got it
    assert a["argv"][2] == mode and a["name"] == "__main__" and a["umask"] == 0o027
    assert (a["probe"], s["probe"]) == ("probe-alone", "probe-served")
    assert (a["cwd"], s["cwd"]) == (str(tmp_path / "alone"), str(tmp_path / "served"))
    assert (a["path0"], s["path0"]) == (a["cwd"], s["cwd"])
    # alone: the job's own process; served: a fork of the server, in its own process group
    assert a["pid"] == p1.pid and s["pid"] != p2.pid
    assert s["ppid"] == srv.pid and s["pgid"] == s["pid"]
    assert not s["torch"]  # the script's own imports, nothing more (torch is not preloaded)
    assert (a["named"], s["named"]) == (False, True)
    # what the server imported is out of the fork's collections' reach (gc.freeze)
    assert a["frozen"] == 0 and s["frozen"] > 0
    # the script's first lines: through the hand-off module, in the fork only
    assert ran_in(alone_out) == [p1.pid]
    assert ran_in(served_out) == ([p2.pid] if start == "python SCRIPT" else []) + [s["pid"]]
    logs = [(tmp_path / k / "job.log").read_text() for k in ("alone", "served")]
    if mode == "error":  # run_script logged the traceback in the fork as it does alone
        assert all("ValueError: boom" in log and "Traceback" in log for log in logs), logs


@pytest.mark.parametrize("start", STARTS)
def test_signals_to_the_job_reach_the_fork(tmp_path, server, start):
    path, _ = server
    # SIGTERM: the fork ends by it, and so does the job's process
    proc, out = start_job(tmp_path, "sleep", path, "term", start=start)
    fork = facts_of(out)["pid"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=DEADLINE)
    assert proc.returncode == -signal.SIGTERM
    wait_until(lambda: not alive(fork), "the fork to end")
    # SIGINT: KeyboardInterrupt in the fork, which handles it and exits with 7
    proc, out = start_job(tmp_path, "sigint", path, "int", start=start)
    fork = facts_of(out)["pid"]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=DEADLINE)
    assert proc.returncode == 7
    assert (tmp_path / "int" / "interrupted").read_text() == "yes"
    # the fork killed from outside (the kernel's OOM killer): the job's process ends the same
    proc, out = start_job(tmp_path, "sleep", path, "oom", start=start)
    os.kill(facts_of(out)["pid"], signal.SIGKILL)
    proc.wait(timeout=DEADLINE)
    assert proc.returncode == -signal.SIGKILL


def gated_server(tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    """A job server (its process, its socket) whose imports wait until the test creates the
    file ``gate``: a job that connects before then waits for a server that still starts,
    whatever the machine's speed."""
    gate = tmp_path / "gate"
    (tmp_path / "slow_import.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\n"
    )
    path = str(tmp_path / "socket")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return job_server.start_server(path, ["slow_import", "crosslip.io"], env=env), path, gate


def wait_for_the_server(job: psutil.Process) -> None:
    """Until the job's process is connected and asleep: its request sent, it waits for the
    reply (nothing else in hand_off sleeps), its forwarded signals blocked since before it
    connected."""
    wait_until(
        lambda: job.net_connections(kind="unix") and job.status() == psutil.STATUS_SLEEPING,
        "the job to wait for the server",
    )


def test_a_job_that_connects_as_the_server_starts_is_served(tmp_path):
    """start_server returns with its socket listening (bound in this process, the server
    inherits it): a job that connects at once, before the server's Python has even started,
    waits in the socket's queue and runs in a fork, as the first job of ``make run`` and of
    the tests' runs may. Before, the server bound the socket only once its own Python ran,
    and such a job found none and ran in its own process (a full tier failed so)."""
    srv, path, gate = gated_server(tmp_path)
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)  # at once: no server process ran yet
        proc, out = start_job(tmp_path, "exit3", path)
        wait_for_the_server(psutil.Process(proc.pid))
        gate.touch()
        _, stderr = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 3 and "not reachable" not in stderr, stderr
        facts = facts_of(out)
        assert facts["ppid"] == srv.pid and facts["pid"] != proc.pid
    finally:
        srv.terminate()
        srv.wait(timeout=DEADLINE)
    assert not os.path.exists(path)  # the server removed its socket


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_that_comes_while_the_server_starts_is_not_lost(tmp_path, signum):
    """The job's process connects while the server still imports (held there until the
    signal has been sent, whatever the machine's speed); the signal then waits until the
    fork exists and ends it before the script runs, as it ends a job that starts. The job's
    process is stopped meanwhile, as a loaded machine may leave it unscheduled: the fork
    waits for it to pass the signal on, however late, instead of running the script."""
    srv, path, gate = gated_server(tmp_path)
    try:
        proc, out = start_job(tmp_path, "sleep", path)
        job = psutil.Process(proc.pid)
        wait_for_the_server(job)
        proc.send_signal(signum)
        job.suspend()  # SIGSTOP: it passes nothing on until SIGCONT
        gate.touch()  # the server ends its imports only now
        server = psutil.Process(srv.pid)
        wait_until(lambda: server.children(), "the fork")
        (fork,) = server.children()
        wait_until(lambda: out.exists() or fork.status() == psutil.STATUS_SLEEPING, "a wait")
        assert not out.exists()  # the fork waits for the job's process
        job.resume()  # SIGCONT: the job's process passes on both signals, then READY
        proc.wait(timeout=DEADLINE)
        # SIGINT: KeyboardInterrupt in the fork before the script starts: it ends by SIGINT
        assert proc.returncode == -signum
        assert not out.exists()  # the script never ran
        assert srv.poll() is None
    finally:
        srv.terminate()
        srv.wait(timeout=DEADLINE)


def test_a_killed_job_process_or_server_leaves_no_fork(tmp_path, server):
    path, srv = server
    proc, out = start_job(tmp_path, "sleep", path, "killed-job")
    fork = facts_of(out)["pid"]
    proc.kill()
    proc.wait(timeout=DEADLINE)
    wait_until(lambda: not alive(fork), "the server to kill the fork of a killed job")
    assert srv.poll() is None  # the server goes on
    proc, out = start_job(tmp_path, "sleep", path, "killed-server")
    fork = facts_of(out)["pid"]
    srv.kill()
    srv.wait(timeout=DEADLINE)
    proc.wait(timeout=DEADLINE)
    assert proc.returncode == 1 and "the job server" in proc.stderr.read()
    wait_until(lambda: not alive(fork), "the fork to die with its server")


@pytest.mark.parametrize("start", STARTS)
def test_a_job_runs_alone_when_no_server_listens(tmp_path, start):
    proc, out = start_job(tmp_path, "plain", str(tmp_path / "no-socket"), start=start)
    _, stderr = proc.communicate(timeout=DEADLINE)
    facts = facts_of(out)
    assert proc.returncode == 0 and facts["pid"] == proc.pid and ran_in(out) == [proc.pid]
    said = f"job server {tmp_path / 'no-socket'} ({job_server.ENV}) is not reachable"
    assert stderr.count(said) == 1 and "this job runs in its own process" in stderr
    # through the hand-off module, the job's process became `python SCRIPT` without the
    # server's name, so that the script does not ask again
    assert facts["named"] == (start == "python SCRIPT")


def test_a_job_the_server_refuses_runs_alone_as_python_script(tmp_path, server, monkeypatch):
    """``python -m crosslip.jobserver.handoff SCRIPT`` in a batch job that the server is not
    in: the server refuses, the reason is said once, and the process becomes ``python
    SCRIPT`` (the same process id) with the script's arguments, folder and exit status."""
    path, srv = server
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    start = "python -m crosslip.jobserver.handoff SCRIPT"
    proc, out = start_job(tmp_path, "exit3", path, start=start, more_env={"SLURM_JOB_ID": "42"})
    stdout, stderr = proc.communicate(timeout=DEADLINE)
    facts = facts_of(out)
    assert proc.returncode == 3 and stdout == "out: exit3\n"
    assert facts["pid"] == proc.pid and facts["ppid"] != srv.pid and ran_in(out) == [proc.pid]
    assert facts["argv"] == [
        str(tmp_path / "job" / "script.py"),
        str(out),
        "exit3",
        str(tmp_path / "job" / "job.log"),
    ]
    assert facts["path0"] == facts["cwd"] == str(tmp_path / "job") and not facts["named"]
    reason = "the job runs in the batch job SLURM_JOB_ID=42, the server outside it"
    assert stderr.count(f"did not take this job: {reason}; it runs in its own process") == 1


def test_the_hand_off_module_needs_a_script():
    cmd = [sys.executable, "-m", "crosslip.jobserver.handoff"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage: python -m crosslip.jobserver.handoff SCRIPT" in proc.stderr


def test_the_server_refuses_another_interpreter_crosslip_or_batch_job_and_its_forks(monkeypatch):
    ours = job_server.identity()
    assert job_server._refusal({"identity": ours, "pid": 1}, set()) is None
    other = dict(ours, crosslip="/elsewhere/crosslip")
    reason = job_server._refusal({"identity": other, "pid": 1}, set())
    assert reason is not None and "crosslip is /elsewhere/crosslip" in reason
    assert "did not say" in job_server._refusal({"identity": {}, "pid": 1}, set())
    assert "already runs in a fork" in job_server._refusal({"identity": ours, "pid": 5}, {5})
    # a job of a batch job runs inside it, not in a server outside it
    in_slurm = {"identity": ours, "pid": 1, "env": {"SLURM_JOB_ID": "42"}}
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    reason = job_server._refusal(in_slurm, set())
    assert reason == "the job runs in the batch job SLURM_JOB_ID=42, the server outside it"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert job_server._refusal(in_slurm, set()) is None


def test_the_command_runs_under_a_server_and_exits_with_its_status(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "facts.json"
    probe = (
        f"import os, subprocess, sys; print(os.environ['{job_server.ENV}'], flush=True); "
        "print(os.getpid(), flush=True); "
        f"sys.exit(subprocess.call([sys.executable, {str(script)!r}, {str(out)!r}, 'exit3', "
        f"{str(tmp_path / 'log')!r}]))"
    )
    cmd = [sys.executable, "-m", "crosslip.jobserver", "--preload", "crosslip.io"]
    proc = subprocess.run(
        [*cmd, "--", sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr
    socket, probe_pid = proc.stdout.splitlines()[:2]
    facts = facts_of(out)  # the job ran in a fork of the server, not as the probe's child
    assert facts["ppid"] != int(probe_pid) and facts["pgid"] == facts["pid"]
    assert "crosslip job server: 1 jobs served" in proc.stderr
    assert not Path(socket).parent.exists()  # its folder is gone with it
    killed = subprocess.run(
        [*cmd, "--", "sh", "-c", "kill -TERM $$"], capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == 128 + signal.SIGTERM
    usage = subprocess.run([*cmd], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "give a command" in usage.stderr


def test_a_command_runs_without_a_server_where_no_socket_can_be_made(monkeypatch, capfd):
    """A socket that cannot be made (here: refused as by a full disk) is no error: the
    command runs, its jobs alone, and a line says why; the server's folder is removed."""

    def refuse(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(job_server, "listen", refuse)
    probe = f"import os, sys; sys.exit(0 if {job_server.ENV!r} not in os.environ else 9)"
    assert job_server.run_under_server([sys.executable, "-c", probe]) == 0
    err = capfd.readouterr().err
    said = re.search(r"crosslip: no job server: cannot listen on (\S+) \(.*No space left", err)
    assert said and "jobs start alone" in err, err
    assert not Path(said.group(1)).parent.exists()


TOY_SNAKEFILE = """
rule all:
    input:
        expand("out/{i}.json", i=range(3)),


rule job:
    output:
        "out/{i}.json",
    log:
        "logs/{i}.log",
    script:
        "job.py"
"""

#: The toy job: its first lines (after Snakemake's preamble) add "i pid" to ``ran``.
TOY_JOB = """
import json, os
with open("ran", "a") as ran:
    ran.write(f"{snakemake.wildcards.i} {os.getpid()}\\n")
from crosslip.io import run_script

def main():
    facts = {"pid": os.getpid(), "ppid": os.getppid(), "file": __file__}
    with open(snakemake.output[0], "w") as f:
        json.dump(facts, f)

run_script(snakemake.log[0], main)
"""


@pytest.mark.slow
def test_snakemake_jobs_run_in_forks_of_the_server_of_their_command(tmp_path):
    """Snakemake's ``script:`` jobs (its preamble, its ``__file__``) through the command:
    Snakemake starts each job as it always does, and run_script hands it to the server
    after its first lines, so that the rest runs in a fork of the server."""
    (tmp_path / "Snakefile").write_text(TOY_SNAKEFILE)
    (tmp_path / "job.py").write_text(TOY_JOB)
    cmd = snakemake_cmd(tmp_path, "--cores", "2", snakefile=tmp_path / "Snakefile", served=False)
    serve = [sys.executable, "-m", "crosslip.jobserver", "--preload", "crosslip.io", "--"]
    env = {k: v for k, v in os.environ.items() if k != job_server.ENV}
    proc = subprocess.run([*serve, *cmd], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    facts = [json.loads((tmp_path / "out" / f"{i}.json").read_text()) for i in range(3)]
    servers = {f["ppid"] for f in facts}
    assert len(servers) == 1 and servers.isdisjoint(f["pid"] for f in facts)
    assert all(f["file"] == str(tmp_path / "job.py") for f in facts)
    assert "crosslip job server: 3 jobs served" in proc.stderr
    assert "runs in its own process" not in proc.stderr
    ran = sorted(tuple(map(int, line.split())) for line in (tmp_path / "ran").open())
    forks = sorted((i, f["pid"]) for i, f in enumerate(facts))
    # the job's own process, then the fork
    assert [i for i, _ in ran] == [0, 0, 1, 1, 2, 2] and set(forks) < set(ran)


def test_no_snakemake_method_is_replaced():
    """The workflow uses Snakemake as it comes: reading the Snakefile under a job server
    leaves Snakemake's script runner as it was."""
    from snakemake.script import PythonScript

    assert not hasattr(PythonScript.execute_script, "crosslip_handoff")
    assert not hasattr(handoff, "serve_script_jobs")


#: The toy workflow's Snakefile, which also writes what its Snakemake process sees, and
#: leaves a thread (not a daemon) and an ``atexit`` function that write when it exits.
SEEN_SNAKEFILE = (
    textwrap.dedent(
        """
        import atexit, json, os, sys, threading, time
        from pathlib import Path

        Path("snakemake.json").write_text(json.dumps({
            "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
            "rundir": workflow.rundir, "probe": os.environ.get("PROBE"), "path": sys.path,
        }))
        threading.Thread(target=lambda: (time.sleep(0.5), Path("thread").write_text("y"))).start()
        atexit.register(lambda: Path("atexit").write_text("y"))
        """
    )
    + TOY_SNAKEFILE
)


def snakemake_lines(text: str, way: str) -> list[tuple[str, ...]]:
    """:func:`helpers.without_stamps` of a run's output, also without its elapsed time, the
    time in its log's name and the folder's own name."""
    text = re.sub(r"\d{4}-\d\d-\d\dT\d{6}\.\d+", "TIME", re.sub(rf"/{way}\b", "/WAY", text))
    return without_stamps(re.sub(r"(?m)^Elapsed time: .*$", "", text))


@pytest.mark.slow
def test_snakemake_served_is_the_snakemake_command(tmp_path):
    """tests/served_snakemake.py, which the slow tests' runs start as (helpers.snakemake_cmd),
    is the ``snakemake`` command: in a fork of the server it sees the same arguments,
    folders and environment (the run directory of its header too), prints the same lines,
    runs its jobs (forked from the same server), waits for its threads and runs its
    ``atexit`` functions as a process of its own does, and exits with the same status."""
    path = str(tmp_path / "socket")
    srv = job_server.start_server(path, ["crosslip.io", "snakemake.cli"])
    try:
        runs = {}
        for way, head in (("alone", [SNAKEMAKE]), ("served", list(SERVED_SNAKEMAKE))):
            work = tmp_path / way
            work.mkdir()
            (work / "Snakefile").write_text(SEEN_SNAKEFILE)
            (work / "job.py").write_text(TOY_JOB)
            env = {k: v for k, v in os.environ.items() if k != job_server.ENV}
            env["PROBE"] = way
            if way == "served":
                env[job_server.ENV] = path
            cmd = [*head, "-s", str(work / "Snakefile"), "--cores", "2"]
            pid, done = run_command(cmd, work, env)
            seen = json.loads((work / "snakemake.json").read_text())
            runs[way] = (pid, done, seen, run_command([*cmd, "no/such/file"], work, env)[1])
    finally:
        srv.terminate()
        srv.wait(timeout=DEADLINE)
    for way, (pid, done, seen, missing) in runs.items():
        work = tmp_path / way
        assert done.returncode == 0, done.stderr
        assert missing.returncode == 1 and "MissingRuleException" in missing.stderr
        assert (seen["cwd"], seen["rundir"], seen["probe"]) == (str(work), str(work), way)
        assert (work / "thread").exists() and (work / "atexit").exists()
        jobs = [json.loads((work / "out" / f"{i}.json").read_text()) for i in range(3)]
        if way == "alone":  # snakemake's own process; its jobs not the server's
            assert seen["pid"] == pid and srv.pid not in {j["ppid"] for j in jobs}
        else:  # a fork of the server, and so are its jobs
            assert seen["ppid"] == srv.pid and seen["pid"] != pid
            assert {j["ppid"] for j in jobs} == {srv.pid}
    (_, alone, seen, alone_missing), (_, served, seen_served, served_missing) = runs.values()
    real = [os.path.realpath(d) for d in seen_served["path"]]  # a venv may be a symbolic link
    assert [re.sub("/alone$", "/served", os.path.realpath(d)) for d in seen["path"]] == real
    assert snakemake_lines(alone.stderr, "alone") == snakemake_lines(served.stderr, "served")
    assert snakemake_lines(alone_missing.stderr, "alone") == snakemake_lines(
        served_missing.stderr, "served"
    )
    assert alone.stdout == served.stdout


def run_command(
    cmd: list[str], cwd: Path, env: dict[str, str]
) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``cmd``, capturing its output: its process id and its result."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=300)
    return proc.pid, subprocess.CompletedProcess(cmd, proc.returncode, out.decode(), err.decode())


def test_workflow_scripts_import_nothing_heavy_before_the_hand_off():
    """A workflow script's own process imports only the standard library and crosslip.io
    at its top: the rest (torch, pandas, the stages) in ``main()``, which only the fork runs
    when a server takes the job (run_script's hand-off)."""
    scripts = sorted((ROOT / "workflow" / "scripts").glob("*.py"))
    assert len(scripts) >= 10
    for script in scripts:
        for node in ast.parse(script.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                ok = name == "crosslip.io" or name.split(".")[0] in sys.stdlib_module_names
                assert ok, f"{script.name} imports {name} at its top: import it in main()"


def test_the_server_imports_every_module_that_a_workflow_script_imports():
    """PRELOAD covers what the scripts import in ``main()``: after it, in a new interpreter,
    every module that a workflow script names is loaded, so a served job imports none."""
    named = set()
    for script in sorted((ROOT / "workflow" / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                named.add(node.module)
            elif isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
    named = {n for n in named if n.split(".")[0] not in sys.stdlib_module_names}
    assert {"pandas", "crosslip.stages.training", "crosslip.report.tables"} <= named
    check = (
        "import importlib, json, sys\n"
        "from crosslip.jobserver.server import PRELOAD\n"
        "for name in PRELOAD: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(set({sorted(named)!r}) - set(sys.modules))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], "add these to jobserver.server.PRELOAD"

"""Test-suite times: the tiers of ``make test-fast`` and ``make test``, side by side with a
baseline commit.

Each tier is one pytest run of this checkout (fast: ``-m "not slow"``; full: every test, as
``.ci/run`` runs it), with the pytest-xdist arguments of the checkout's own Makefile
(``XDIST``; none in commits from before the suite ran in workers). With ``--baseline REF``
the same tiers run on REF as well (a local clone in a temporary folder, REF's ``src`` first
on ``PYTHONPATH``, so one environment runs both; ``CROSSLIP_SHARED`` reaches both runs, and
a REF from before that variable finds the same folder as ``shared/`` beside its clone),
alternating candidate and baseline for ``--rounds`` rounds. Prints per tier the median wall
time and CPU time (with the cores busy on average), the tests passed and skipped, the ratio
to the baseline and to the target (``make test`` at most 6 min, ``make test-fast`` at most
90 s on a 2-core machine), and the slowest tests of the candidate's last run; the last line
is one JSON object. A tier that fails stops the
benchmark: the time of a failing suite means nothing.
Run: ``.venv/bin/python benchmarks/suite_times.py [--tiers fast full] [--baseline REF]``
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ROOT, finish, parser
from crosslip.device import describe_machine
from crosslip.machine import git_commit

TIERS = {"fast": ["-m", "not slow"], "full": []}
TARGET_SECONDS = {"fast": 90.0, "full": 360.0}
SUMMARY = re.compile(r"(\d+ (?:passed|skipped|deselected|warnings?)\b.*) in ([\d.]+)s")
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown) +(\S+)$")


def xdist_arguments(checkout: Path) -> list[str]:
    """The pytest-xdist arguments that ``make test`` of ``checkout`` passes (its Makefile's
    ``XDIST ?= ...``), or none where its Makefile has no such line."""
    found = re.search(r"^XDIST \?=(.*)$", (checkout / "Makefile").read_text(), re.MULTILINE)
    return shlex.split(found[1]) if found else []


def run_tier(checkout: Path, tier: str, select: list[str], env: dict[str, str]) -> dict:
    """One pytest run of ``tier`` in ``checkout`` as its ``make test`` runs it: wall seconds,
    CPU seconds (user and system of pytest and every process it waited for, as
    ``/usr/bin/time`` counts them), counts, slowest tests."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15"]
    cmd += xdist_arguments(checkout)
    t0, cpu0 = time.perf_counter(), children_cpu_seconds()
    proc = subprocess.run(
        [*cmd, *TIERS[tier], *select], cwd=checkout, env=env, capture_output=True, text=True
    )
    seconds, cpu = time.perf_counter() - t0, children_cpu_seconds() - cpu0
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-5000:] + proc.stderr[-2000:])
        raise SystemExit(f"the {tier} tier failed in {checkout} (pytest exit {proc.returncode})")
    lines = proc.stdout.splitlines()
    found = [m for m in map(SUMMARY.search, lines) if m]
    if not found:
        raise SystemExit(f"no pytest summary line in the {tier} tier's output")
    counts = {
        word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|deselected)", found[-1][1])
    }
    slowest = [
        {"seconds": float(m[1]), "when": m[2], "test": m[3]}
        for m in map(DURATION.match, lines)
        if m
    ]
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "pytest_seconds": float(found[-1][2]),
        **counts,
        "slowest": slowest,
    }


def children_cpu_seconds() -> float:
    """User and system CPU seconds of the finished child processes of this one so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def baseline_checkout(ref: str, into: Path) -> Path:
    """REF checked out in ``into/checkout``, a local clone (a git repository, as a checkout
    that CI runs is, so that REF's own tests may call git), with ``into/shared`` pointing to
    ``$CROSSLIP_SHARED`` where that is set (the folder of the MNIST mirror, the paper and the
    GPU runs that some tests read, which a REF from before the variable looks for there)."""
    commit = git_commit(ROOT, ref)
    if not commit:
        raise SystemExit(f"--baseline {ref}: not a commit of the checkout at {ROOT}")
    checkout = into / "checkout"
    git = ["git", "-c", "advice.detachedHead=false"]
    subprocess.run([*git, "clone", "-q", "--shared", "-n", str(ROOT), str(checkout)], check=True)
    subprocess.run([*git, "-C", str(checkout), "checkout", "-q", commit], check=True)
    if os.environ.get("CROSSLIP_SHARED"):
        (into / "shared").symlink_to(Path(os.environ["CROSSLIP_SHARED"]).resolve())
    return checkout


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring): no ``--device`` or ``--threads``, as
    the suite runs in pytest processes of its own."""
    ap = parser(__doc__, torch_options=False)
    ap.add_argument("--tiers", nargs="+", choices=sorted(TIERS), default=["fast", "full"])
    ap.add_argument("--baseline", metavar="REF", help="git commit or branch to time as well")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each tier and checkout")
    ap.add_argument(
        "--select", nargs="*", default=[], help="pytest arguments that pick tests (smoke runs)"
    )
    return ap


def main() -> None:
    args = arguments().parse_args()
    machine = describe_machine("cpu")
    print(f"machine: {machine}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result: dict = {
        "machine": machine,
        "baseline": args.baseline,
        "xdist": " ".join(xdist_arguments(ROOT)),
        "tiers": {},
    }
    with tempfile.TemporaryDirectory(prefix="suite-baseline-") as tmp:
        base = baseline_checkout(args.baseline, Path(tmp)) if args.baseline else None
        base_env = {**env, "PYTHONPATH": str(base / "src")} if base else None
        if base is not None:
            result["baseline_xdist"] = " ".join(xdist_arguments(base))
        for tier in args.tiers:
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(run_tier(ROOT, tier, args.select, env))
                if base is not None:
                    theirs.append(run_tier(base, tier, args.select, base_env))
            secs = statistics.median(r["seconds"] for r in ours)
            cpu = statistics.median(r["cpu_seconds"] for r in ours)
            entry = {
                "seconds": secs,
                "cpu_seconds": cpu,
                "busy_cores": cpu / secs,
                "passed": ours[-1].get("passed", 0),
                "skipped": ours[-1].get("skipped", 0),
                "target_seconds": TARGET_SECONDS[tier],
                "ratio_to_target": secs / TARGET_SECONDS[tier],
                "slowest": ours[-1]["slowest"][:10],
            }
            line = f"{tier}: {secs:.1f} s ({cpu:.0f} s of CPU), {entry['passed']} passed, "
            line += f"{entry['skipped']} skipped"
            line += f"; x{entry['ratio_to_target']:.2f} the target {TARGET_SECONDS[tier]:.0f} s"
            if theirs:
                base_secs = statistics.median(r["seconds"] for r in theirs)
                base_cpu = statistics.median(r["cpu_seconds"] for r in theirs)
                entry |= {
                    "baseline_seconds": base_secs,
                    "baseline_cpu_seconds": base_cpu,
                    "baseline_passed": theirs[-1].get("passed", 0),
                    "ratio_to_baseline": secs / base_secs,
                }
                line += f"; baseline {base_secs:.1f} s, {base_cpu:.0f} s of CPU"
                line += f" (x{secs / base_secs:.2f})"
            print(line)
            for slow in entry["slowest"]:
                print(f"  {slow['seconds']:7.2f} s  {slow['when']:8s} {slow['test']}")
            result["tiers"][tier] = entry
    finish(result)


if __name__ == "__main__":
    main()

"""`make run` times: the default workflow from a fresh clone, side by side with a baseline
commit.

Each run is ``make run`` (the embedded default config: 5 networks and 2 kernel models on
mnist5k, 200 points certified and attacked each) in a fresh local clone of the commit with
an empty ``results/``, with this checkout's environment (``--venv``, default ``.venv``;
``make -o`` keeps it from being rebuilt) and the clone's own ``src`` first on
``PYTHONPATH``, so one environment runs both commits. ``--candidate`` (default ``HEAD``:
commit what you measure) and ``--baseline`` take turns over ``--rounds`` rounds, so that
load from other processes hits both alike. Prints per commit the median wall time, its CPU
time (with the cores busy on average), the seconds Snakemake recorded per stage (its
``benchmark:`` files: the jobs' own time, summed), the ratio to the baseline and to the
target (``make run`` at most 4 minutes on a 2-core machine); the last line is one JSON
object. A run that fails stops the benchmark.
Run: ``.venv/bin/python benchmarks/make_run_times.py --baseline REF [--rounds 2]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ROOT, finish, parser
from crosslip.device import describe_machine
from gpu_session import snakemake_seconds
from suite_times import baseline_checkout, children_cpu_seconds

TARGET_SECONDS = 240.0


def make_run(ref: str, venv: Path, cores: str) -> dict:
    """One ``make run`` of ``ref`` in a fresh clone: wall and CPU seconds, the stages'."""
    with tempfile.TemporaryDirectory(prefix="make-run-times-") as tmp:
        checkout = baseline_checkout(ref, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
        stamp = venv / ".crosslip-installed"
        cmd = ["make", "-o", str(stamp), "run", f"VENV={venv}", f"CORES={cores}"]
        t0, cpu0 = time.perf_counter(), children_cpu_seconds()
        proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
        seconds, cpu = time.perf_counter() - t0, children_cpu_seconds() - cpu0
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit(f"make run of {ref} failed (exit {proc.returncode})")
        return {
            "seconds": seconds,
            "cpu_seconds": cpu,
            "stages": snakemake_seconds(checkout / "results"),
        }


def summary(runs: list[dict]) -> dict:
    """Medians over the runs of one commit."""
    secs = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    stages = {s: statistics.median(r["stages"][s] for r in runs) for s in runs[0]["stages"]}
    return {
        "seconds": secs,
        "each_seconds": [r["seconds"] for r in runs],
        "cpu_seconds": cpu,
        "busy_cores": cpu / secs,
        "stage_seconds": stages,
    }


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring): no ``--device`` or ``--threads``, as
    the workflow's jobs run in processes of their own."""
    ap = parser(__doc__, torch_options=False)
    ap.add_argument("--baseline", metavar="REF", help="git commit or branch to time as well")
    ap.add_argument("--candidate", metavar="REF", default="HEAD", help="the commit measured")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each commit")
    ap.add_argument("--cores", default="all", help="make run's CORES (Snakemake's --cores)")
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the environment")
    return ap


def main() -> None:
    args = arguments().parse_args()
    machine = describe_machine("cpu")
    print(f"machine: {machine}")
    refs = [args.candidate] + ([args.baseline] if args.baseline else [])
    runs: dict[str, list[dict]] = {ref: [] for ref in refs}
    for _ in range(args.rounds):
        for ref in refs:
            runs[ref].append(make_run(ref, args.venv.resolve(), args.cores))
            print(f"  {ref}: {runs[ref][-1]['seconds']:.1f} s", flush=True)
    result: dict = {"machine": machine, "cores": args.cores, "target_seconds": TARGET_SECONDS}
    for ref in refs:
        entry = summary(runs[ref])
        key = "candidate" if ref == args.candidate else "baseline"
        result[key] = {"ref": ref, **entry}
        stages = ", ".join(f"{s} {v:.0f} s" for s, v in entry["stage_seconds"].items())
        print(
            f"{key} {ref}: {entry['seconds']:.1f} s ({entry['cpu_seconds']:.0f} s of CPU, "
            f"{entry['busy_cores']:.2f} cores busy); jobs: {stages}"
        )
    secs = result["candidate"]["seconds"]
    result["ratio_to_target"] = secs / TARGET_SECONDS
    result["within_target"] = secs <= TARGET_SECONDS
    line = f"make run: {secs:.1f} s, x{secs / TARGET_SECONDS:.2f} the target {TARGET_SECONDS:.0f} s"
    if args.baseline:
        result["ratio_to_baseline"] = secs / result["baseline"]["seconds"]
        line += f"; x{result['ratio_to_baseline']:.2f} the baseline"
    print(line)
    finish(result)


if __name__ == "__main__":
    main()

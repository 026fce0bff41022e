"""A GPU session in parts of under 10 minutes each (so that a session can be split across
short allocations): the checks and benchmarks that only a GPU can run (docs/scaling.md,
"A GPU session"), their logs and benchmark records written to one folder and packed into
one tarball.

Parts (``PART``):

* ``check``: the device as torch sees it (``nvidia-smi`` where there is one), ``pytest -m
  cuda``, then ``bench_grid`` (G = 1, 8, 26 batched against separate), ``bench_adversarial``
  and ``bench_train`` on the device;
* ``project``: ``bench_preset`` on the device: the MNIST preset with the GPU override on
  full MNIST projected from measured parts, with its arithmetic floor;
* ``validate``: the projection checked against a real run: the MNIST preset with the GPU
  override, its plain setting only, ``--epochs`` epochs and ``--points`` evaluation points,
  run by Snakemake (``profiles/local-gpu``) and projected by ``bench_preset`` for the same
  config: the run's wall time is its command's seconds in ``summary.json``, the seconds
  Snakemake recorded per rule its ``snakemake_seconds_by_rule``, the projection per stage
  the ``bench_preset`` record's;
* ``compile``: ``bench_compile`` (``torch.compile`` against the eager step), and
  ``bench_grid`` with ``--tf32`` (``train.tf32``: TF32 products, against its own bound).

Each command runs with a time limit, its output in ``<name>.log``. A benchmark's JSON line
becomes ``<name>.json``, a record in the format of ``python benchmarks/perfdoc.py``
(docs/benchmarks/), named after the benchmark and the device (``bench_grid_cuda``): copy it
into docs/benchmarks/ and render docs/performance.md. ``summary.json`` lists every command
with its exit status and seconds; a command that fails or runs out of time is recorded and
the part goes on. The folder is packed as ``<out>/gpu-<part>.tar.gz``.

On the GPU machine, in the checkout, with the environment installed and MNIST's four
``.gz`` files in a folder (``--mirror``)::

    python3 benchmarks/gpu_session.py check --mirror /path/to/mnist --out results/gpu-session

(``CROSSLIP_COMMIT=<sha>`` names the commit where the checkout has no git history.)

``--dry-run`` prints the commands of a part and runs none (on any machine).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRESET = ["config/presets/mnist.yaml", "config/overrides/gpu.yaml"]
PARTS = ("check", "project", "validate", "compile")
#: Seconds a part may take in all: under 10 minutes, so that each fits a short allocation.
PART_SECONDS = 560


@dataclass
class Command:
    """One command of a part: ``name`` (its log and record), ``argv``, its time limit, and
    whether its last output line is a benchmark's JSON object to keep as a record."""

    name: str
    argv: list[str]
    seconds: int
    record: bool = True


def bench(name: str, device: str, seconds: int, *args: str) -> Command:
    """``benchmarks/<name>.py --device <device> args``, recorded as ``<name>_<device>``."""
    argv = [sys.executable, f"benchmarks/{name}.py", "--device", device, *args]
    return Command(f"{name}_{device}", argv, seconds)


def validate_results(work: Path) -> str:
    """The ``validate`` part's results folder, relative to the checkout and new for each
    session (named after its temporary folder), so that no earlier run's outputs make
    Snakemake skip a job."""
    return f"results/gpu-validate-{work.name}"


def validate_config(work: Path, mirror: str, epochs: int, points: int) -> Path:
    """The override of the ``validate`` part: the plain setting, ``epochs`` epochs,
    ``points`` evaluation points, written to ``work``; its results go to
    :func:`validate_results` (the config takes only a relative folder)."""
    override = {
        "results": validate_results(work),
        "data": {"mirrors": {"mnist": mirror}},
        "train": {"settings": ["plain"], "epochs": epochs},
        "certify": {"n_points": points},
        "attack": {"n_points": points},
    }
    path = work / "validate.yaml"
    path.write_text(yaml.safe_dump(override))
    return path


def commands(part: str, args: argparse.Namespace, work: Path) -> list[Command]:
    """The commands of ``part`` (module docstring)."""
    dev, mirror = args.device, args.mirror
    if part == "check":
        probe = (
            "import torch; from crosslip.device import describe_machine; "
            f"print(describe_machine({dev!r})); print(torch.version.cuda, "
            "torch.backends.cudnn.version(), torch.backends.cuda.matmul.allow_tf32)"
        )
        return [
            Command("device", [sys.executable, "-c", probe], 30, record=False),
            Command("nvidia-smi", ["nvidia-smi"], 15, record=False),
            Command(
                "pytest_cuda",
                [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"],
                240,
                record=False,
            ),
            bench("bench_grid", dev, 150),
            bench("bench_adversarial", dev, 60),
            bench("bench_train", dev, 60),
        ]
    if part == "project":
        # the H200 record's sample (6,000 digits, 500 points): the whole of full MNIST
        # does not fit one call on an H100
        sample = ["--train-points", "6000", "--points", "500", "--startup-runs", "2"]
        return [bench("bench_preset", dev, 540, "--mirror", mirror, *sample)]
    if part == "validate":
        override = validate_config(work, mirror, args.epochs, args.points)
        files = [*PRESET, str(override)]
        snakemake = [sys.executable, "-m", "snakemake", "--profile", "profiles/local-gpu"]
        snakemake += ["--resources", "gpu=2", "--configfile", *files]
        return [
            bench("bench_preset", dev, 240, "--configfile", *files, "--mirror", mirror),
            Command("snakemake", snakemake, 300, record=False),
        ]
    if part == "compile":
        tf32 = bench("bench_grid", dev, 120, "--sizes", "8", "26", "--tf32")
        tf32.name = f"bench_grid_tf32_{dev}"
        return [bench("bench_compile", dev, 420), tf32]
    raise ValueError(f"unknown part {part!r}: use one of {', '.join(PARTS)}")


def run(cmd: Command, folder: Path) -> dict[str, Any]:
    """Run ``cmd`` in the checkout with its time limit, output to ``folder/<name>.log``;
    its record to ``folder/<name>.json`` where it printed one. Returns its summary."""
    # perfdoc.py beside this file, also where this script is loaded without its folder on
    # sys.path (runpy.run_path, as tests/test_gpu_session.py does)
    perfdoc = runpy.run_path(str(Path(__file__).with_name("perfdoc.py")))
    entry, write_record = perfdoc["entry"], perfdoc["write_record"]

    log = folder / f"{cmd.name}.log"
    t0 = time.perf_counter()
    with log.open("w") as out:
        out.write("$ " + shlex.join(cmd.argv) + "\n")
        out.flush()
        try:
            proc = subprocess.run(
                cmd.argv,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=cmd.seconds,
            )
            status: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            status = f"timed out after {cmd.seconds} s"
        except FileNotFoundError as exc:
            status = f"not found: {exc.filename}"
    seconds = time.perf_counter() - t0
    summary: dict[str, Any] = {"name": cmd.name, "status": status, "seconds": round(seconds, 1)}
    if cmd.record and status == 0:
        try:
            rec = entry(cmd.name, ["python3", *cmd.argv[1:]], log.read_text())
        except ValueError as exc:
            summary["record"] = f"no JSON line: {exc}"
        else:
            summary["record"] = write_record(rec, folder).name
    return summary


def snakemake_seconds(results: Path) -> dict[str, float]:
    """Seconds Snakemake recorded (``benchmark:`` files, column ``s``) per rule folder."""
    totals: dict[str, float] = {}
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        rule = tsv.relative_to(results / "benchmarks").parts[0]
        rows = tsv.read_text().splitlines()
        if len(rows) >= 2:
            totals[rule] = totals.get(rule, 0.0) + float(rows[1].split("\t")[0])
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=PARTS)
    ap.add_argument("--out", type=Path, help="where the tarball goes (default: $OUT)")
    ap.add_argument("--device", default="cuda", help="the benchmarks' --device")
    ap.add_argument("--mirror", default=".gpu-wheels/mnist", help="folder of the MNIST files")
    ap.add_argument("--epochs", type=int, default=10, help="validate: epochs of the real run")
    ap.add_argument("--points", type=int, default=2000, help="validate: evaluation points")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    args = ap.parse_args()
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None and not args.dry_run:
        ap.error("give --out (or set OUT): the folder the tarball goes to")
    with tempfile.TemporaryDirectory(prefix=f"gpu-{args.part}-") as tmp:
        folder = Path(tmp)
        cmds = commands(args.part, args, folder)
        if sum(c.seconds for c in cmds) > PART_SECONDS:
            raise SystemExit(f"part {args.part}: its time limits add up to over {PART_SECONDS} s")
        if args.dry_run:
            for c in cmds:
                print(f"[{c.seconds:>3} s] {c.name}: {shlex.join(c.argv)}")
            return
        summaries = []
        for cmd in cmds:
            print(f"{args.part}: {cmd.name} (at most {cmd.seconds} s) ...", flush=True)
            summaries.append(run(cmd, folder))
            print(f"  {summaries[-1]}", flush=True)
        result: dict[str, Any] = {"part": args.part, "commands": summaries}
        if args.part == "validate":
            result["snakemake_seconds_by_rule"] = snakemake_seconds(ROOT / validate_results(folder))
        (folder / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out / f"gpu-{args.part}.tar.gz", "w:gz") as tar:
            for path in sorted(folder.iterdir()):
                if path.is_file():
                    tar.add(path, arcname=path.name)
        print(json.dumps(result))


if __name__ == "__main__":
    main()

"""What the scripts in ``benchmarks/`` share, written once.

* the command line: :func:`parser` gives ``--device {auto,cpu,cuda}`` and ``--threads N``
  (:mod:`crosslip.device`), to which a benchmark adds its own options
  (:func:`add_mirror_argument`: ``--mirror``, the folder of the official MNIST files);
* the set-up: :func:`start` parses it, sets torch's CPU threads, resolves the device and
  names the machine, once, in a :class:`Run`;
* timing: :func:`timed` reads the clock around a call with the device synchronised, and
  :func:`medians` times kinds that take turns over rounds, the median of each;
* the end: :func:`finish` prints the JSON line that ends every benchmark's output (the
  object that ``python benchmarks/perfdoc.py record`` keeps in ``docs/benchmarks/``), and
  writes it with its provenance (command, date, commit: :func:`benchmarks.perfdoc.provenance`)
  where asked.

A benchmark runs as ``python benchmarks/<name>.py``: Python puts the script's folder first on
``sys.path``, so ``from _harness import ...`` (and a sibling benchmark's import) needs no
path of its own. A new benchmark::

    from _harness import finish, parser, start, timed

    def arguments() -> argparse.ArgumentParser:
        ap = parser(__doc__)
        ap.add_argument("--points", type=int, default=200)
        return ap

    def main() -> None:
        bench = start(arguments())
        out, seconds = timed(lambda: work(bench.args.points), bench.device)
        res = {**bench.header(), "seconds": seconds}
        print(bench.machine_line())
        finish(res)

(``arguments`` by that name: tests/test_benchmarks.py checks every benchmark's parser.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from crosslip.device import (
    add_device_argument,
    add_threads_argument,
    describe_machine,
    resolve_device,
    synchronize,
)
from perfdoc import provenance

T = TypeVar("T")

#: The repository (``benchmarks/`` is one of its folders).
ROOT = Path(__file__).resolve().parents[1]


def parser(doc: str, *, torch_options: bool = True) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first line of its docstring ``doc``, with
    ``--device`` and ``--threads`` unless ``torch_options`` is false (a benchmark that runs
    no torch code of its own); the benchmark adds its own options."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if torch_options:
        add_device_argument(ap)
        add_threads_argument(ap)
    return ap


def add_mirror_argument(ap: argparse.ArgumentParser) -> None:
    """``--mirror FOLDER``: a folder holding the official MNIST files under their official
    names, as the config key ``data.mirrors.mnist`` (docs/data.md). Without it (the
    default) the files come from the benchmark's download cache, else from the official
    location."""
    ap.add_argument(
        "--mirror",
        default=None,
        metavar="FOLDER",
        help="folder of the official MNIST files (default: none; the cache, else a download)",
    )


@dataclasses.dataclass(frozen=True)
class Run:
    """A benchmark's parsed options, its device and the machine, named once (after torch's
    threads are set: the name says how many)."""

    args: argparse.Namespace
    device: torch.device
    machine: str

    def header(self) -> dict[str, str]:
        """The keys a benchmark's JSON line starts with: ``machine`` and ``device``."""
        return {"machine": self.machine, "device": str(self.device)}

    def machine_line(self) -> str:
        """The first line of a benchmark's report: the machine and the device."""
        return f"machine: {self.machine} (device {self.device})"


def start(ap: argparse.ArgumentParser, argv: list[str] | None = None) -> Run:
    """Parse the command line (``argv``, default ``sys.argv``) with ``ap`` (from
    :func:`parser`), set torch's CPU threads to ``--threads`` and resolve ``--device``."""
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    return Run(args, device, describe_machine(device))


def timed(fn: Callable[[], T], device: torch.device | str = "cpu") -> tuple[T, float]:
    """``(fn(), seconds)``, with ``device`` synchronised before both clock readings (CUDA
    runs asynchronously: the time covers the computation, not its launch)."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


def medians(
    kinds: Mapping[str, Callable[[], object]], rounds: int, device: torch.device | str
) -> dict[str, float]:
    """The median seconds of each of ``kinds`` (name -> call) over ``rounds`` rounds in which
    they take turns, so that load from other processes hits them all alike. Each result is
    dropped at once (keeping them would grow the heap and time page faults)."""
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind, fn in kinds.items():
            times[kind].append(timed(fn, device)[1])
    return {kind: statistics.median(t) for kind, t in times.items()}


def finish(result: dict[str, Any], out: Path | None = None) -> None:
    """End the benchmark: where ``out`` is given, write ``result`` there with the command,
    date and commit of this run; then print ``result`` as the one JSON line that ends the
    output."""
    if out is not None:
        command = [Path(sys.executable).name, *sys.argv]
        entry = {**provenance(command), "result": result}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(entry, indent=1) + "\n")
    print(json.dumps(result))

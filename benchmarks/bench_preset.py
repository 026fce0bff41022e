"""Preset benchmark: how long a whole preset takes on one device, projected from a measured
part of each of its stages, against one process per model side by side.

A preset (default ``config/presets/mnist.yaml`` with ``config/overrides/gpu.yaml``, merged
as Snakemake merges several ``--configfile``) is too long to run inside one benchmark: the
MNIST preset trains 78 networks for 200 epochs and certifies and attacks 10,000 points with
each. This benchmark runs the workflow's own stage functions on a part of that work and
projects the rest; every projection is linear in what it scales:

* **training** (per setting, the workflow's jobs of :func:`crosslip.jobs.batches.plan_batches`
  through :func:`crosslip.stages.training.train_grid_stage`): the setting's whole grid
  trained as one batched model for ``E1`` and for ``E2`` epochs (``--epochs E1 E2``) on
  ``--train-points`` digits; the difference gives the seconds per epoch, the rest the fixed
  cost (set-up, the CUDA graph's recording, writing the models). Projected: fixed + epochs x
  seconds per epoch x (full training set's steps / measured steps).
* **per model, side by side** (``train.batch_grid: false``,
  :func:`crosslip.stages.training.train_stage`): each model evaluated below also trained
  alone for ``E1`` and ``E2`` epochs, projected in the same way, times the setting's grid.
* **certification and attacks** (:func:`crosslip.stages.certification.certify_stage` and
  :func:`crosslip.stages.attack.attack_stage`, the config's every setting: kinds, norms, the
  refinement and the minimal-norm attack): ``--models-per-setting`` trained models spread
  over the grid, each on ``--points`` evaluation points (default: the config's
  ``n_points``); the mean per model, times the setting's models, times config points over
  measured points. The first of them is attacked once more without the minimal-norm attack
  (``min_norm_steps`` 0), which gives that attack's share. These models have trained for
  ``E2`` epochs, not the preset's: an attack's cost depends a little on the margins.
* **start-up**: a Python process that imports the stages and initialises the device,
  timed (median of ``--startup-runs``), times the jobs on the device: batched (this config)
  or one per model.
* **the arithmetic floor** (:mod:`benchmarks.flops`): the matrix-product flops of each stage,
  counted by dtype in untimed runs of the same work (a setting's grid trained for 1 and 2
  epochs without a CUDA graph, projected as the seconds are; the first evaluated model of a
  setting certified and attacked), over the device's matrix-product rate in that dtype
  (float32 at the training step's shapes, float64 at the evaluation's), measured here. The
  projection over the floor says how far from its arithmetic the preset runs; the flops
  do not depend on the device, so the floor on another device is the flops over its rates
  (docs/scaling.md, "The arithmetic floor").

Not counted: preparing the data (once), the tables and figures (CPU jobs), and Snakemake's
own scheduling. The jobs are summed as if they ran one after another; a profile that lets
two share the device (``--resources gpu=2``) can only be faster where the device is not
full. The target: the MNIST preset in 30 minutes on one H100 (``--target-minutes``).
``--settings`` measures some settings only (the projection is then of those); ``--dataset``
and ``--hidden`` replace the preset's (tiny runs). ``--mirror``: the folder of the official
MNIST files (a config that names ``data.mirrors.mnist`` keeps its own); without either, the
files come from the config's download cache, else a download.
The last line is one JSON object; ``projected_preset_seconds`` and
``speedup_vs_per_model`` are the headline figures.
Run: ``.venv/bin/python benchmarks/bench_preset.py [--device auto]``
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from _harness import ROOT, add_mirror_argument, finish, parser, start, timed
from crosslip.attacks.settings import AttackSettings
from crosslip.certify.settings import CertifySettings
from crosslip.config.grid import dataset_names, networks_only, training_grid
from crosslip.config.specs import NetTrainSpec, spec_params
from crosslip.config.validate import merged_files, validate
from crosslip.data import Dataset, load_prepared, save_prepared
from crosslip.jobs.batches import evaluation_params
from crosslip.stages.attack import attack_stage
from crosslip.stages.certification import certify_stage
from crosslip.stages.data import prepare_data
from crosslip.stages.training import train_grid_stage, train_stage
from crosslip.training.grid import REGULARIZER_ORDER, train_grid
from flops import count_flops, matmul_rate
from projection import job_count, projected, training_jobs

CONFIGS = [ROOT / "config" / "presets" / "mnist.yaml", ROOT / "config" / "overrides" / "gpu.yaml"]
STARTUP = (
    "import torch, crosslip.stages.attack, crosslip.stages.certification, "
    "crosslip.stages.training; torch.zeros(1, device={device!r}).sum().item()"
)


def scaled(flops: dict[str, int], factor: float) -> dict[str, float]:
    """Each dtype's flops times ``factor``."""
    return {k: v * factor for k, v in flops.items()}


def added(*parts: dict[str, int] | dict[str, float]) -> dict[str, float]:
    """The flops of ``parts`` added dtype by dtype."""
    total: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total


def floor_seconds(flops: dict[str, float], rates: dict[str, float]) -> float:
    """Seconds of ``flops`` (by dtype) at ``rates`` (flop/s by dtype)."""
    return sum(v / rates[k] for k, v in flops.items())


def spread(models: list[str], k: int) -> list[str]:
    """``k`` of ``models`` spread from the first to the last."""
    if k <= 1 or len(models) == 1:
        return models[:1]
    return list(dict.fromkeys(models[round(i * (len(models) - 1) / (k - 1))] for i in range(k)))


def startup_seconds(device: torch.device, runs: int) -> float:
    """Median seconds of a fresh Python process that imports the stages and touches
    ``device``: what every job pays before its work."""
    command = [sys.executable, "-c", STARTUP.format(device=str(device))]
    job = partial(subprocess.run, command, check=True)
    return statistics.median(timed(job)[1] for _ in range(runs))


@dataclasses.dataclass
class Measure:
    """What the measurements of one setting share (module docstring)."""

    work: Path
    dev: torch.device
    data: Path  # the prepared dataset
    part: Path  # its first --train-points training digits
    nets: dict[str, NetTrainSpec]
    epochs: tuple[int, int]
    full_epochs: int
    step_scale: float  # full training set's steps per epoch / measured steps
    points: int
    n_test: int
    config: dict[str, Any]

    def seconds(self, fn: Callable[[], object]) -> float:
        """Seconds of ``fn()`` on the device (:func:`_harness.timed`)."""
        return timed(fn, self.dev)[1]

    def train_batched(self, job: list[str], e: int) -> float:
        """Seconds of the workflow's batched training of ``job`` for ``e`` epochs."""
        specs = {m: dataclasses.replace(self.nets[m], epochs=e) for m in job}
        out = {m: (self.model(m, e), self.metrics(m, e)) for m in job}
        return self.seconds(partial(train_grid_stage, self.part, specs, out, str(self.dev)))

    def train_alone(self, m: str, e: int) -> float:
        """Seconds of ``m`` trained in a job of its own (``train.batch_grid: false``)."""
        params = spec_params(dataclasses.replace(self.nets[m], epochs=e))
        folder = self.work / f"alone-e{e}" / m
        job = partial(train_stage, self.part, params, m, folder / "model.pt", folder / "m.json")
        return self.seconds(partial(job, device=str(self.dev)))

    @functools.cached_property
    def part_data(self) -> Dataset:
        """The measured training digits, read once for every flop count."""
        return load_prepared(self.part)

    def train_flops(self, job: list[str], e: int) -> dict[str, int]:
        """Matrix-product flops by dtype of ``job`` trained as one batched model for ``e``
        epochs (no CUDA graph: its replays are not counted), untimed."""
        ds = self.part_data
        specs = [dataclasses.replace(self.nets[m], epochs=e) for m in job]
        run = partial(train_grid, specs, ds, device=self.dev, cuda_graph=False)
        return count_flops(run)[1]

    def model(self, m: str, e: int) -> Path:
        return self.work / f"e{e}" / m / "model.pt"

    def metrics(self, m: str, e: int) -> Path:
        return self.work / f"e{e}" / m / "metrics.json"

    def certify(self, m: str) -> float:
        """Seconds of the certification stage of ``m`` (trained ``E2`` epochs)."""
        e = self.epochs[1]
        settings = CertifySettings.from_params(evaluation_params(self.config, "certify"))
        settings = settings.but(n_points=self.points, device=str(self.dev))
        stage = partial(
            certify_stage,
            self.data,
            self.model(m, e),
            self.metrics(m, e),
            self.work / "certify.parquet",
            settings,
        )
        return self.seconds(stage)

    def attack(self, m: str, **change: Any) -> float:
        """Seconds of the attack stage of ``m`` with the config's settings, ``change``d."""
        e = self.epochs[1]
        settings = AttackSettings.from_params(evaluation_params(self.config, "attack"))
        settings = settings.but(n_points=self.points, device=str(self.dev), **change)
        stage = partial(
            attack_stage,
            self.data,
            self.model(m, e),
            self.metrics(m, e),
            self.work / "attack.parquet",
            settings,
            self.work / "examples.npz",
        )
        return self.seconds(stage)

    def setting(self, jobs: list[list[str]], per_setting: int) -> dict[str, Any]:
        """The figures of one setting whose training ``jobs`` are given."""
        e1, e2 = self.epochs
        models = sorted(
            (m for job in jobs for m in job),
            key=lambda m: (REGULARIZER_ORDER.index(self.nets[m].regularizer), m),
        )
        t = {e: sum(self.train_batched(job, e) for job in jobs) for e in (e1, e2)}
        batched = projected(t[e1], t[e2], e1, e2, self.full_epochs, self.step_scale)
        chosen = spread(models, per_setting)
        alone = [
            projected(
                self.train_alone(m, e1),
                self.train_alone(m, e2),
                e1,
                e2,
                self.full_epochs,
                self.step_scale,
            )
            for m in chosen
        ]
        certify = [self.certify(m) for m in chosen]
        attack = [self.attack(m) for m in chosen]
        without_min_norm = self.attack(chosen[0], min_norm_steps=0)
        g = len(models)
        alone_each = statistics.mean(a["projected_seconds"] for a in alone)
        n_eval = min(self.config["certify"]["n_points"], self.n_test)
        n_attack = min(self.config["attack"]["n_points"], self.n_test)
        f = {e: added(*(self.train_flops(job, e) for job in jobs)) for e in (1, 2)}
        per_epoch = {k: f[2].get(k, 0) - f[1].get(k, 0) for k in f[2]}
        fixed = {k: max(f[1].get(k, 0) - per_epoch[k], 0) for k in per_epoch}
        train_flops = added(fixed, scaled(per_epoch, self.full_epochs * self.step_scale))
        certify_flops = count_flops(partial(self.certify, chosen[0]))[1]
        attack_flops = count_flops(partial(self.attack, chosen[0]))[1]
        return {
            "networks": g,
            "train_jobs": len(jobs),
            "train_batched": batched,
            "train_per_model_each": {
                "seconds_per_epoch": statistics.mean(a["seconds_per_epoch"] for a in alone),
                "projected_seconds": alone_each,
            },
            "train_per_model_projected_seconds": g * alone_each,
            "models_evaluated": chosen,
            "certify_seconds_per_model": statistics.mean(certify),
            "certify_projected_seconds": g * statistics.mean(certify) * n_eval / self.points,
            "attack_seconds_per_model": statistics.mean(attack),
            "attack_min_norm_share": max(attack[0] - without_min_norm, 0.0) / attack[0],
            "attack_projected_seconds": g * statistics.mean(attack) * n_attack / self.points,
            "flops": {
                "train_per_epoch": scaled(per_epoch, self.step_scale),
                "train": train_flops,
                "certify_per_model": scaled(certify_flops, n_eval / self.points),
                "certify": scaled(certify_flops, g * n_eval / self.points),
                "attack_per_model": scaled(attack_flops, n_attack / self.points),
                "attack": scaled(attack_flops, g * n_attack / self.points),
            },
        }


def report(res: dict[str, Any]) -> None:
    """The figures in lines."""
    e1, e2 = res["epochs_measured"]
    print(
        f"{' + '.join(res['configfiles'])}, {res['dataset']}: {res['networks']} networks x "
        f"{res['epochs']} epochs on {res['train_points']} digits, {res['eval_points']} points "
        f"certified and attacked per model; measured: epochs {e1} and {e2} on "
        f"{res['train_points_measured']} digits, models spread over each grid on "
        f"{res['eval_points_measured']} points"
    )
    for setting, s in res["settings"].items():
        b = s["train_batched"]
        print(
            f"{setting}: {s['networks']} networks in {s['train_jobs']} job(s): "
            f"{b['seconds_per_epoch']:.2f} s/epoch batched, "
            f"{s['train_per_model_each']['seconds_per_epoch']:.2f} s/epoch per network alone; "
            f"train {b['projected_seconds']:.0f} s (one job per model "
            f"{s['train_per_model_projected_seconds']:.0f} s); certify "
            f"{s['certify_seconds_per_model']:.2f} s/model -> {s['certify_projected_seconds']:.0f}"
            f" s; attack {s['attack_seconds_per_model']:.2f} s/model "
            f"({100 * s['attack_min_norm_share']:.0f}% minimal-norm) -> "
            f"{s['attack_projected_seconds']:.0f} s"
        )
    print(
        f"start-up {res['startup_seconds_per_job']:.1f} s per job: {res['jobs']} jobs, "
        f"{res['jobs_per_model']} with one per model"
    )
    stages = res["projected_seconds_by_stage"]
    print(
        "projected: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in stages.items())
        + f"; in all {res['projected_preset_seconds'] / 60:.1f} min (target "
        f"{res['target_seconds'] / 60:g} min on one H100: "
        f"{'within' if res['within_target'] else 'over'}); one job per model "
        f"{res['projected_per_model_seconds'] / 60:.1f} min, "
        f"x{res['speedup_vs_per_model']:.2f}"
    )
    floors = res["arithmetic_floor_seconds_by_stage"]
    rates = ", ".join(f"{k} {v:.0f}" for k, v in res["matmul_gflops"].items())
    print(
        f"arithmetic floor at this device's matrix products ({rates} GFLOP/s): "
        + ", ".join(
            f"{k} {floors[k] / 60:.1f} min (x{res['ratio_to_arithmetic_floor_by_stage'][k]:.1f})"
            for k in floors
        )
        + f"; in all {res['arithmetic_floor_seconds'] / 60:.1f} min, the projection without "
        f"start-up x{res['ratio_to_arithmetic_floor']:.1f} it"
    )
    for stage, f in res["flops_by_stage"].items():
        print(f"  {stage}: " + ", ".join(f"{v / 1e15:.3g} PFLOP {k}" for k, v in f.items()))


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--configfile", type=Path, nargs="+", default=CONFIGS)
    ap.add_argument("--settings", nargs="+", help="measure these settings only")
    ap.add_argument("--dataset", help="replace the preset's datasets by this one")
    add_mirror_argument(ap)
    ap.add_argument("--hidden", type=int, help="replace model.hidden")
    ap.add_argument("--epochs", type=int, nargs=2, default=[1, 3], metavar=("E1", "E2"))
    ap.add_argument("--train-points", type=int, help="training digits per epoch (default all)")
    ap.add_argument("--points", type=int, help="evaluation points (default the config's)")
    ap.add_argument("--models-per-setting", type=int, default=2)
    ap.add_argument("--startup-runs", type=int, default=3)
    ap.add_argument("--target-minutes", type=float, default=30.0)
    ap.add_argument("--rate-repeats", type=int, default=5, help="timings of each product shape")
    return ap


def main() -> None:
    ap = arguments()
    bench = start(ap)
    args, dev = bench.args, bench.device
    e1, e2 = args.epochs
    if not 0 < e1 < e2:
        ap.error(f"--epochs {e1} {e2}: give two epoch counts, 0 < E1 < E2")
    with tempfile.TemporaryDirectory(prefix="bench_preset-") as tmp:
        work = Path(tmp)
        config = merged_files(args.configfile)
        mirrors = config.setdefault("data", {}).setdefault("mirrors", {})
        if args.mirror:
            mirrors.setdefault("mnist", str(args.mirror))
        if args.dataset:
            config["datasets"] = [args.dataset]
        if args.hidden:
            config.setdefault("model", {})["hidden"] = args.hidden
        if args.settings:
            config["train"]["settings"] = args.settings
        validate(config)
        config["results"] = str(work / "results")  # no model trained: all need training
        if not networks_only(config):
            ap.error("only one dataset of one-hidden-layer networks is projected")
        grid = nets = training_grid(config)
        (dataset,) = dataset_names(config)
        data, part = work / "data.npz", work / "part.npz"
        prepare_data(dataset, data, config["data"]["cache"], mirrors.get(dataset))
        full = load_prepared(data)
        n_full = len(full.y_train)
        n_train = min(args.train_points or n_full, n_full)
        x, y = full.x_train[:n_train], full.y_train[:n_train]
        save_prepared(dataclasses.replace(full, x_train=x, y_train=y), part)
        n_eval = min(config["certify"]["n_points"], len(full.y_test))
        points = min(args.points or n_eval, n_eval)
        batch = next(iter(nets.values())).batch_size
        measure = Measure(
            work,
            dev,
            data,
            part,
            nets,
            (e1, e2),
            config["train"]["epochs"],
            math.ceil(n_full / batch) / math.ceil(n_train / batch),
            points,
            len(full.y_test),
            config,
        )
        jobs = training_jobs(config, grid, nets)
        if dev.type == "cuda":  # the first training pays the context, cuBLAS and kernel loads
            measure.train_batched(next(iter(jobs.values()))[0], e1)
        settings = {}
        for s, j in jobs.items():  # a line per setting, so a run cut off still tells
            settings[s] = measure.setting(j, args.models_per_setting)
            print(
                f"[{s}] {settings[s]['networks']} networks: train "
                f"{settings[s]['train_batched']['projected_seconds']:.0f} s, certify "
                f"{settings[s]['certify_projected_seconds']:.0f} s, attack "
                f"{settings[s]['attack_projected_seconds']:.0f} s projected",
                file=sys.stderr,
                flush=True,
            )
        n_jobs = job_count(config, grid, jobs)
        d, h, k = full.x_train.shape[1], config["model"]["hidden"], full.num_classes
        rows = min(n_eval, 4096)
        # the training step's products (Cross-Lipschitz's, the forward's, the weights'
        # gradient) and the evaluation's (a batch of points through U, its gradient)
        shapes = [(batch * (k - 1), h, d), (batch, d, h), (h, batch, d), (rows, d, h), (h, rows, d)]
    startup = startup_seconds(dev, args.startup_runs)
    sets = settings.values()
    stages = {
        "train": sum(s["train_batched"]["projected_seconds"] for s in sets),
        "certify": sum(s["certify_projected_seconds"] for s in sets),
        "attack": sum(s["attack_projected_seconds"] for s in sets),
        "startup": startup * n_jobs,
    }
    flops = {k: added(*(s["flops"][k] for s in sets)) for k in ("train", "certify", "attack")}
    dtypes = sorted({dtype for f in flops.values() for dtype in f})
    rates = {
        dtype: matmul_rate(shapes, dev, getattr(torch, dtype), args.rate_repeats)
        for dtype in dtypes
    }
    floors = {k: floor_seconds(f, rates) for k, f in flops.items()}
    per_model = {
        **stages,
        "train": sum(s["train_per_model_projected_seconds"] for s in sets),
        "startup": startup * 3 * len(nets),
    }
    total, total_per_model = sum(stages.values()), sum(per_model.values())
    res = {
        **bench.header(),
        "configfiles": [os.path.relpath(f, ROOT) for f in args.configfile],
        "dataset": dataset,
        "networks": len(nets),
        "hidden": config["model"]["hidden"],
        "epochs": config["train"]["epochs"],
        "epochs_measured": [e1, e2],
        "train_points": n_full,
        "train_points_measured": n_train,
        "eval_points": n_eval,
        "eval_points_measured": points,
        "settings": settings,
        "startup_seconds_per_job": startup,
        "jobs": n_jobs,
        "jobs_per_model": 3 * len(nets),
        "projected_seconds_by_stage": stages,
        "projected_per_model_seconds_by_stage": per_model,
        "projected_preset_seconds": total,
        "projected_per_model_seconds": total_per_model,
        "speedup_vs_per_model": total_per_model / total,
        "flops_by_stage": flops,
        "matmul_gflops": {k: v / 1e9 for k, v in rates.items()},
        "arithmetic_floor_seconds_by_stage": floors,
        "arithmetic_floor_seconds": sum(floors.values()),
        "ratio_to_arithmetic_floor_by_stage": {k: stages[k] / floors[k] for k in floors},
        "ratio_to_arithmetic_floor": (total - stages["startup"]) / sum(floors.values()),
        "target_seconds": args.target_minutes * 60,
        "within_target": total <= args.target_minutes * 60,
    }
    print(bench.machine_line())
    report(res)
    finish(res)


if __name__ == "__main__":
    main()

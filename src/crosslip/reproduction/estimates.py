"""GPU time of the runs the record lacks (:data:`TARGETS`), projected by
:mod:`crosslip.projection`, the estimator of ``benchmarks/bench_preset.py``, from the job
seconds of committed GPU runs (run.yaml ``job_seconds.<rule>.each``).

From the GPU runs with the most epochs and, where there are some, those with the next fewer,
:func:`measure` takes per regularizer a training job's seconds per SGD step and its fixed
cost (:func:`crosslip.projection.projected`; with one epoch count the line goes through the
origin, the fixed cost inside the steps, so slightly high), the seconds per evaluated point
of a certify and of an attack job (start-up included), and how many jobs shared the GPU
(``--resources gpu=N`` of the command). Kernel models come from the ``bench_kernel_scale``
benchmark kept with a GPU run (run.yaml ``benchmarks``): seconds per L-BFGS objective
evaluation and per certified point; training is bounded by L-BFGS's most evaluations
(``torch.optim.LBFGS``: ``max_eval`` = 1.25 x ``max_iter``), so its figure is an upper bound.

:func:`estimate` charges them to the jobs the workflow runs for a config
(:func:`crosslip.projection.training_jobs`), sums them (job time) and divides by the jobs
sharing the GPU. What the measurements cannot say is said beside the number: a batched
job's step, the augment and adversarial steps (so a lower bound) and other datasets are
charged the per-model plain step measured on MNIST; attacks on kernel models and ResNets
are not estimated.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config.grid import dataset_names, training_grid
from ..config.specs import KernelTrainSpec
from ..errors import ConfigError
from ..jobs.selection import method_of
from ..projection import one_dataset, projected, training_jobs
from .claims import LABEL, NET_ORDER, Run, duration
from .export import ExportError, effective_config

#: Training and test points of the registered datasets (crosslip.data: the IDX files of
#: MNIST, ``cifar10.COUNTS``, ``gtsrb.COUNTS``; tests/test_reproduction.py checks them).
TRAIN_POINTS = {"mnist": 60000, "cifar10": 50000, "gtsrb": 39209}
TEST_POINTS = {"mnist": 10000, "cifar10": 10000, "gtsrb": 12630}
#: The offline MNIST mirror beside the checkout (a GPU machine may reach nothing else).
MNIST_MIRROR = "../shared/data/mnist"


_DATA = yaml.safe_load(Path(__file__).with_name("estimates.yaml").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Target:
    """A run the record lacks: ``configs`` (relative to the repository) in ``--configfile``
    order, and what it would add to the record."""

    key: str
    what: str
    configs: Sequence[str]
    adds: str
    figures: Sequence[str] = ()  # the paper's figures (labels) it would make
    gpu_jobs: int | None = None  # jobs sharing the GPU, where not as measured
    claims: Sequence[str] = ()  # the claims (keys of paper.CLAIMS) only this run covers
    why_not_here: str = ""  # why no committed run made it, where it is the data


def _target(offline: str = "", why: str = "", **entry: Any) -> Target:
    """A target of ``estimates.yaml``: no offline copy of the data ``offline``, and ``why``."""
    reasons = [_DATA["no_offline_copy"].format(data=offline) if offline else "", why]
    return Target(**entry, why_not_here="; ".join(r for r in reasons if r))


#: The runs the record lacks (``estimates.yaml`` beside this module), in the record's order.
TARGETS = [_target(**t) for t in _DATA["targets"]]


@dataclass
class Measured:
    """Per-job costs measured on a GPU (see the module docstring)."""

    runs: tuple[str, ...]  # the runs with the most epochs, then those with the next fewer
    device: str
    cores: int | None
    gpu_jobs: int
    epochs: int  # the most epochs
    step_s: dict[str, float]  # regularizer -> seconds per SGD step, the fixed cost apart
    step_jobs: dict[str, int]  # regularizer -> training jobs behind step_s
    certify_s: float  # seconds per certified point (mean over jobs)
    attack_s: float  # seconds per attacked point
    eval_jobs: int
    fewer_epochs: int = 0  # the next fewer epochs (0: none, the fit through the origin)
    fixed_s: float = 0.0  # a training job's fixed cost (mean over the regularizers)
    fewer_gpu_jobs: int = 0  # the jobs that shared the GPU in the runs of fewer epochs
    #: expansion points -> (seconds per L-BFGS objective evaluation, set-up seconds, seconds
    #: per certified point), from bench_kernel_scale; ``kernel_run`` names its run
    kernel: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    kernel_run: str = ""


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _train_jobs(runs: list[Run]) -> dict[str, list[tuple[float, int]]]:
    """Per regularizer, (seconds, steps per epoch) of each training job of ``runs``."""
    out: dict[str, list[tuple[float, int]]] = {}
    for run in runs:
        method = run.by_job("method")
        batch = run.meta["config"]["train"]["batch_size"]
        for key, sec in run.meta["job_seconds"]["train"]["each"].items():
            ds = key.split("/")[0]
            if key in method and ds in TRAIN_POINTS:  # a model of the summary, of known size
                out.setdefault(method[key], []).append((sec, math.ceil(TRAIN_POINTS[ds] / batch)))
    return out


def measure(runs: list[Run]) -> Measured | None:
    """The per-job costs from the committed GPU runs with per-job seconds: the runs with the
    most epochs and those with the next fewer (``None`` when there is none)."""
    gpu = [
        r
        for r in runs
        if r.device not in ("CPU", "–")
        and r.epochs
        and "each" in (r.meta.get("job_seconds") or {}).get("train", {})
    ]
    if not gpu:
        return None
    counts = sorted({r.epochs for r in gpu})
    top, fewer = counts[-1], counts[-2] if len(counts) > 1 else 0
    use, low = [r for r in gpu if r.epochs == top], [r for r in gpu if r.epochs == fewer]
    high_jobs, low_jobs = _train_jobs(use), _train_jobs(low)
    step_s, step_jobs, fixed = {}, {}, []
    for m, jobs in high_jobs.items():
        below = low_jobs.get(m, [])
        t1, e1 = (_mean([t for t, _ in below]), fewer) if below else (0.0, 0)
        fit = projected(t1, _mean([t for t, _ in jobs]), e1, top, top)
        step_s[m] = fit["seconds_per_epoch"] / _mean([k for _, k in jobs])
        step_jobs[m] = len(jobs) + len(below)
        fixed += [fit["fixed_seconds"]] if below else []
    cert: list[float] = []
    att: list[float] = []
    for run in use:
        points = run.by_job("n_eval")
        for rule, out in [("certify", cert), ("attack", att)]:
            for key, sec in (run.meta["job_seconds"].get(rule) or {}).get("each", {}).items():
                if points.get(key, 0) > 0:
                    out.append(sec / points[key])
    machine = use[0].meta.get("machine")
    kernel, kernel_run = {}, ""
    for run in gpu:
        bench = (run.meta.get("benchmarks") or {}).get("bench_kernel_scale")
        for row in (bench or {}).get("sizes", []):
            per_iteration = row["seconds_per_lbfgs_iteration"] * row["lbfgs_iterations"]
            per_eval = per_iteration / row["lbfgs_evaluations"]
            n = int(row["n_centers"])
            kernel[n] = (per_eval, row["setup_seconds"], row["certify_seconds_per_point"])
            kernel_run = run.name
    if not step_s:
        return None
    return Measured(
        runs=tuple(r.name for r in use + low),
        device=use[0].device,
        cores=machine.get("logical_cpus") if isinstance(machine, dict) else None,
        gpu_jobs=max(r.gpu_jobs or 1 for r in use),
        epochs=top,
        step_s=step_s,
        step_jobs=step_jobs,
        certify_s=_mean(cert) if cert else float("nan"),
        attack_s=_mean(att) if att else float("nan"),
        eval_jobs=len(cert),
        fewer_epochs=fewer if fixed else 0,
        fixed_s=_mean(fixed) if fixed else 0.0,
        fewer_gpu_jobs=max((r.gpu_jobs or 1 for r in low), default=0),
        kernel=kernel,
        kernel_run=kernel_run,
    )


@dataclass
class Estimate:
    """A target's models, its command, and the estimate with its arithmetic (``lines``).
    ``job_s``/``gpu_s`` are ``None`` when nothing in it was measured; ``lower`` marks a
    lower bound; ``unmeasured`` lists what the numbers leave out."""

    target: Target
    command: str
    trained: int = 0
    evaluated: int = 0
    lines: list[str] = field(default_factory=list)
    job_s: float | None = None
    gpu_s: float | None = None
    lower: bool = False
    unmeasured: list[str] = field(default_factory=list)
    summary: str = "–"  # the estimate in a few words


def command(target: Target, m: Measured, cfg: dict[str, Any]) -> str:
    """The command that makes ``target`` (its effective config ``cfg``) on a machine like
    the measured one, reading MNIST from the mirror beside the checkout."""
    cmd = (
        f".venv/bin/snakemake --profile profiles/local-gpu --cores {m.cores or 'all'} "
        f"--resources gpu={target.gpu_jobs or m.gpu_jobs} "
        f"--configfile {' '.join(target.configs)}"
    )
    mirrors = (cfg.get("data") or {}).get("mirrors") or {}
    if "mnist" in dataset_names(cfg) and "mnist" not in mirrors:
        cmd += f' --config \'data={{"mirrors": {{"mnist": "{MNIST_MIRROR}"}}}}\''
    return cmd


def _training(est: Estimate, m: Measured, cfg: dict[str, Any], ds: str, nets: dict) -> float:
    """The training jobs of ``nets`` on ``ds`` as the workflow runs them, one line per
    setting; their job seconds."""
    total = 0.0
    for setting, jobs in training_jobs(one_dataset(cfg, ds), nets, nets).items():
        specs = [nets[n] for job in jobs for n in job]
        regs = [r for r in NET_ORDER if any(s.regularizer == r for s in specs)]
        per_epoch = [math.ceil(TRAIN_POINTS[ds] / s.batch_size) for s in specs]
        steps = [(s, s.epochs * k) for s, k in zip(specs, per_epoch, strict=True)]
        secs = sum(m.step_s[s.regularizer] * k for s, k in steps) + len(jobs) * m.fixed_s
        total += secs
        counts = ", ".join(f"{LABEL[r]} {sum(s.regularizer == r for s in specs)}" for r in regs)
        rates = ", ".join(f"{LABEL[r]} {1000 * m.step_s[r]:.2f}" for r in regs)
        fixed = f" + {len(jobs)} × {m.fixed_s:.1f} s fixed" if m.fixed_s else ""
        line = (
            f"{ds}, {setting}: {len(specs)} networks ({counts}) in {len(jobs)} "
            f"job{'s' if len(jobs) > 1 else ''} × {_values(s.epochs for s in specs)} epochs × "
            f"{_values(per_epoch)} steps = {sum(k for _, k in steps):,} SGD steps, × ms per step "
            f"({rates}){fixed} = {duration(secs)} of training jobs"
        )
        if setting != "plain":
            est.lower = True
            line += (
                f" (at least: the {setting} step does more, not measured; the plain step's time)"
            )
        est.lines.append(
            line + ("" if ds == "mnist" else " (assumes the step time measured on MNIST)")
        )
    return total


def estimate(target: Target, m: Measured, root: Path) -> Estimate:
    """The GPU time of ``target`` from ``m`` (module docstring), its configs read under
    ``root``. Raises :class:`~crosslip.reproduction.export.ExportError` for a config that
    is missing or invalid."""
    cfg = effective_config([root / c for c in target.configs])
    est = Estimate(target, command(target, m, cfg))
    grid = training_grid(cfg)
    best_only = cfg["certify"]["models"] == "best"
    evaluated: set[tuple[str, str, str, str]] = set()
    kernels: dict[tuple[str, int], list[int]] = {}  # (dataset, centres) -> max_iter of each
    other: Counter[str] = Counter()  # kind -> models not measured
    train_s = 0.0
    for ds in dataset_names(cfg):
        nets = {}
        for model_id, spec in grid.items():
            est.trained += 1
            kernel = isinstance(spec, KernelTrainSpec)
            kind, setting = ("kernel", "plain") if kernel else (spec.arch, spec.setting)
            method = method_of({"regularizer": spec.regularizer, "lam": spec.lam})
            evaluated.add((ds, kind, setting, method if best_only else model_id))
            if kernel and (centers := spec.n_centers or TRAIN_POINTS.get(ds, 0)) in m.kernel:
                kernels.setdefault((ds, centers), []).append(spec.max_iter)
            elif kind == "mlp" and spec.regularizer in m.step_s and ds in TRAIN_POINTS:
                nets[model_id] = spec
            else:
                other[kind] += 1
        train_s += _training(est, m, cfg, ds, nets) if nets else 0.0
    est.evaluated = len(evaluated)
    per_kind = Counter((ds, kind) for ds, kind, _, _ in evaluated)  # models evaluated
    eval_s = 0.0
    for ds in sorted(ds for ds, kind in per_kind if kind == "mlp" and ds in TEST_POINTS):
        k = per_kind[ds, "mlp"]
        pc, pa = _points(cfg, ds)
        secs = k * (pc * m.certify_s + pa * m.attack_s)
        eval_s += secs
        est.lines.append(
            f"{ds}, certify and attack: {k} networks × ({pc:,} points × "
            f"{1000 * m.certify_s:.2f} ms + {pa:,} points × {1000 * m.attack_s:.2f} ms) = "
            f"{duration(secs)} of jobs"
            + ("" if ds == "mnist" else " (assumes the time per point measured on MNIST)")
        )
    kernel_train = kernel_cert = 0.0
    for (ds, centers), iters in kernels.items():
        per_eval, setup, per_point = m.kernel[centers]
        evals = [i * 5 // 4 for i in iters]  # torch.optim.LBFGS's default max_eval
        secs = sum(e * per_eval + setup for e in evals)
        kernel_train += secs
        est.lines.append(
            f"{ds}, kernel models: {len(iters)} × (at most {_values(evals)} L-BFGS objective "
            f"evaluations (max_iter {_values(iters)} × 1.25) × {per_eval:.2f} s + "
            f"{setup:.2f} s set-up) at {centers:,} expansion points = at most "
            f"{duration(secs)} of training jobs (bench_kernel_scale of run `{m.kernel_run}`: "
            "Kernel-CL; Kernel-LogReg assumed to cost the same)"
        )
        k = per_kind[ds, "kernel"]
        pc, pa = _points(cfg, ds)
        secs = k * pc * per_point
        kernel_cert += secs
        est.lines.append(
            f"{ds}, kernel certify: {k} models × {pc:,} points × {per_point:.2f} s = "
            f"{duration(secs)} of jobs"
        )
        est.unmeasured.append(
            f"{ds}, kernel attack: {k} models × {pa:,} points at {centers:,} expansion "
            "points: not measured"
        )
    for kind, n in sorted(other.items()):
        what = {"kernel": "kernel models", "resnet": "ResNets"}.get(kind, f"{kind} models")
        est.unmeasured.append(f"{n} {what}: no committed GPU run measured them")
    n = target.gpu_jobs or m.gpu_jobs
    if train_s or kernels:  # the networks' evaluation only where their training is measured
        est.job_s = (train_s + eval_s if train_s else 0.0) + kernel_train + kernel_cert
        est.gpu_s = est.job_s / n
    if train_s:
        least = "at least " if est.lower else ""
        est.summary = ("≥ " if est.lower else "") + duration(est.gpu_s)
        est.lines.append(
            f"total: {least}{duration(est.job_s)} of job time / {n} jobs sharing the "
            f"GPU = {least}{duration(est.gpu_s)} on one GPU"
        )
    elif kernels:
        est.summary = (
            f"≤ {duration(kernel_train / n)} training + {duration(kernel_cert / n)} "
            "certification, attacks not measured"
        )
        est.lines.append(
            f"total: at most {duration(kernel_train)} training and {duration(kernel_cert)} "
            f"certification jobs, {n} at a time on one GPU; the attacks come on top"
        )
    return est


def _points(cfg: dict[str, Any], ds: str) -> tuple[int, int]:
    """The points of ``ds`` that each model certifies and attacks (at most its test set)."""
    test = TEST_POINTS.get(ds, 0)
    return min(cfg["certify"]["n_points"], test), min(cfg["attack"]["n_points"], test)


def _values(xs: Iterable[int]) -> str:
    """The distinct values, ``/``-separated (``200`` or ``160/200``)."""
    return "/".join(f"{x:,}" for x in sorted(set(xs)))


def estimates(runs: list[Run], root: Path) -> tuple[Measured | None, list[Estimate | str]]:
    """The measurement and, per target, its estimate (or a one-line reason, such as a
    config missing under ``root``)."""
    m = measure(runs)
    if m is None:
        return None, []
    out: list[Estimate | str] = []
    for t in TARGETS:
        try:
            out.append(estimate(t, m, root))
        except (ExportError, ConfigError) as err:
            out.append(f"{t.key}: {err}")
    return m, out

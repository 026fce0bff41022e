"""How long a config's run takes on one device, projected from measured parts: the
estimator of ``bench_preset.py``, which measures the parts on the device (the reproduction
record's runs not yet made show its committed projections, crosslip.reproduction.targets).

* **The jobs** are those the workflow runs for a fresh results folder
  (:func:`training_jobs`): per setting, the networks that train as one batched model
  (:func:`crosslip.jobs.batches.plan_batches`: with ``train.batch_grid``, one job per
  dataset, setting and seed, docs/architecture.md "Training a grid as one model"), and a job
  of its own for every other model; :func:`job_count` adds the certification and attack jobs
  (one per model, or per setting where ``<stage>.batch_models``).
* **A training job** of E epochs costs a fixed part (start-up, set-up, writing the models)
  plus E times its seconds per epoch. Two trainings of E1 and E2 epochs give both: the
  difference over E2 - E1 is the cost of an epoch, the rest the fixed part
  (:func:`projected`), projected linearly to the config's epochs and training set.
"""

from __future__ import annotations

from typing import Any

from crosslip.config.specs import NetTrainSpec
from crosslip.jobs.batches import evaluation_batches, plan_batches


def projected(t1: float, t2: float, e1: int, e2: int, epochs: int, scale: float = 1.0) -> dict:
    """Trainings of ``e1`` and ``e2`` epochs took ``t1`` and ``t2`` seconds: the seconds per
    epoch, the fixed cost (at least 0) and the projection to ``epochs`` epochs of ``scale``
    times the measured steps. With ``e1 = t1 = 0`` the line goes through the origin: no
    fixed cost, the seconds per epoch ``t2 / e2``. Where the longer training was not the
    slower one (``t2 <= t1``: the epochs are lost in the noise of a one-off cost, as the
    first training of a process on a GPU showed) the line through the origin and the longer
    training is taken instead, an overestimate, and ``through_origin`` says so: projecting
    an epoch as free would be worse."""
    if t2 > t1:
        per_epoch, through_origin = (t2 - t1) / (e2 - e1), False
    else:
        per_epoch, through_origin = t2 / e2, True
    fixed = max(t1 - e1 * per_epoch, 0.0) if not through_origin else 0.0
    return {
        "measured_seconds": [t1, t2],
        "through_origin": through_origin,
        "seconds_per_epoch": per_epoch * scale,
        "fixed_seconds": fixed,
        "projected_seconds": fixed + epochs * per_epoch * scale,
    }


def training_jobs(
    config: dict[str, Any], grid: dict[str, Any], nets: dict[str, NetTrainSpec]
) -> dict[str, list[list[str]]]:
    """Per setting, the networks of each training job of a fresh run of ``config`` (one
    dataset): the workflow's batches, and a grid of one for a network alone."""
    jobs: dict[str, list[list[str]]] = {}
    batches = plan_batches(config, grid, code="projection", fresh=True)
    for b in batches:
        jobs.setdefault(b.setting, []).append(list(b.models))
    batched = {m for b in batches for m in b.models}
    for m, spec in nets.items():
        if m not in batched:
            jobs.setdefault(spec.setting, []).append([m])
    return jobs


def job_count(
    config: dict[str, Any], grid: dict[str, Any], jobs: dict[str, list[list[str]]]
) -> int:
    """The jobs on the device of a fresh run of ``config``: training (``jobs``), then
    certification and attacks, batched where the config says so, else one per model."""
    count = sum(len(js) for js in jobs.values())
    for stage in ("certify", "attack"):
        batches = evaluation_batches(config, grid, stage)
        count += len(batches) + len(grid) - sum(len(b.models) for b in batches)
    return count

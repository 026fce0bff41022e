"""Snakemake resources (``mem_mb``, ``runtime``, ``gpu``) of the train, certify and attack
jobs, from the config and the model's training spec. Torch-free: the rules call it while the
workflow is planned.

* ``gpu``: 1 for every train, certify and attack job unless config ``device`` is ``cpu``:
  each of them runs on the device (:func:`crosslip.device.resolve_device`), so
  ``--resources gpu=N`` (profiles/local-gpu) caps how many share the GPUs, and on SLURM each
  gets one (profiles/slurm). Without a limit Snakemake does not count it.
* ``mem_mb`` (host memory): networks as before (4,000 MB); kernel models the peak of their
  memory plan (:mod:`crosslip.kernel_memory`, within ``kernel.memory_gb``) where the job may
  run on the CPU (``device`` ``cpu`` or ``auto``), plus the process and the dataset (float32
  and a float64 copy); with ``device: cuda`` the plan lives in GPU memory and the host holds
  the process, the data and the model.
* Datasets of your own (declared in the config) are read only by the jobs: their networks get
  the defaults above, their kernel models the whole budget and a day.
* ``runtime`` (minutes): kernel models from the flop counts of the chunked algorithm at an
  assumed sustained float64 rate (:data:`FLOPS`: the CPU's near what this project's 2-core
  machine gave, see docs/kernels-at-scale.md; the GPU's a conservative share of an
  H100-class card), times :data:`SAFETY`; one-hidden-layer networks from the measured cost
  per training sample on that CPU (Cross-Lipschitz, the slowest regularizer); ResNets a
  fixed day (not measured here). The attack jobs of networks: an hour, or with the
  minimal-norm attack its flop count (:func:`net_attack_minutes`).

What ``--set-threads`` and ``--set-resources`` give a per-model rule reaches its batched
rules through :func:`.snakemake_internals.take_overrides`.
"""

from __future__ import annotations

import math
from typing import Any

from ..kernel_memory import (
    BYTES,
    DATASET_SHAPES,
    KernelMemoryError,
    budget_bytes,
    centers_used,
    certify_plan,
    device_kind,
    train_plan,
)

#: Sustained float64 rate assumed for the runtime estimate, flop/s, by device kind. On one
#: core of this project's CPU the Gram matrix ran at about 7e10 and the L-BFGS evaluations
#: (bound by memory traffic) at about 1e10 (docs/kernels-at-scale.md); the GPU's is assumed.
FLOPS = {"cpu": 2.0e10, "cuda": 5.0e12}
#: Pair evaluations of Proposition 2.2 per second (one pair of centres for one point at one
#: radius, about 20 elementwise operations), by device kind: the CPU's measured on one core
#: (3.1e7 to 3.9e7 at 2,000 and 5,000 MNIST centres, docs/kernels-at-scale.md); the GPU's
#: assumed (not measured here).
PAIRS_PER_SECOND = {"cpu": 3.0e7, "cuda": 3.0e9}
#: Radii tried per point by the search of Theorem 2.1 (about 5 at rtol 1e-3) with margin.
EVALUATIONS = 10
#: L-BFGS objective evaluations per iteration (line searches), with margin.
EVALS_PER_ITER = 1.5
#: Factor on every runtime estimate.
SAFETY = 2.0
#: Seconds per training sample of the 784-1024-10 network on the 2-core CPU (Cross-Lipschitz
#: in closed form, batch 64: about 20 ms per step, README "Training speed"), with margin.
MLP_SECONDS_PER_SAMPLE = 5e-4
#: The same on one GPU (an H100, separate jobs: about 150 s for 200 epochs of full MNIST,
#: the runs of docs/reproduction/mnist-h100-200ep), with margin; a batched grid costs at most
#: this per network.
MLP_SECONDS_PER_SAMPLE_CUDA = 2e-5
#: Host memory of the process itself (Python, torch, CUDA context), MB.
PROCESS_MB = 2000
NET_MEM_MB = 4000
#: Runtime (minutes) of a kernel job on a dataset of your own, whose size is not known
#: while the workflow is planned.
UNKNOWN_SHAPE_MINUTES = 24 * 60
#: Points per batch of the attacks (:func:`crosslip.attacks.upper_bound`).
ATTACK_BATCH = 512


def _is_kernel(spec: Any) -> bool:
    return getattr(spec, "regularizer", "") in ("kernel_logreg", "kernel_cl")


def _minutes(seconds: float, floor: int) -> int:
    return max(floor, math.ceil(SAFETY * seconds / 60))


def kernel_working_set(
    config: dict[str, Any], spec: Any, dataset: str, stage: str, kind: str | None = None
) -> int:
    """Bytes a kernel job holds on a device of ``kind`` (``cpu``, ``cuda``; default: the
    config's ``device``): the peak of its training or certification plan within
    ``kernel.memory_gb``; for the attacks a batch of class gradients (three (batch, K, N)
    arrays) and the centres."""
    shape = DATASET_SHAPES[dataset]
    n, d, K = shape.n_train, shape.dim, shape.classes
    N = centers_used(spec.n_centers, n)
    budget = budget_bytes(config["kernel"]["memory_gb"])
    kind = device_kind(config["device"]) if kind is None else kind
    try:
        if stage == "train":
            return train_plan(n, N, d, K, spec.regularizer, budget, kind).peak_bytes
        if stage == "certify":
            return certify_plan(N, d, K, budget, kind).peak_bytes
    except KernelMemoryError:  # does not fit: validation reports it
        return budget
    return BYTES * (3 * ATTACK_BATCH * K * N + 2 * N * d)


def _kernel_mem_mb(config: dict[str, Any], spec: Any, dataset: str, stage: str) -> int:
    shape = DATASET_SHAPES[dataset]
    N = centers_used(spec.n_centers, shape.n_train)
    data = (shape.n_train + shape.n_test) * shape.dim * (4 + 8)  # float32 + float64 copy
    host = PROCESS_MB + math.ceil(data / 2**20) + math.ceil(16 * N * shape.dim / 2**20)
    if config["device"].startswith("cuda"):
        return host
    # where the job may run on the CPU, its plan's arrays are in host memory
    return host + math.ceil(kernel_working_set(config, spec, dataset, stage, "cpu") / 2**20)


def kernel_train_seconds(config: dict[str, Any], spec: Any, dataset: str) -> float:
    """Estimated seconds of one kernel training job: the nearest-neighbour distances
    (``2 n^2 d``), the penalty matrix (Kernel-CL: one kernel matrix per pass, ``2 n N d``
    each, and ``4 n N^2`` for the products; Kernel-LogReg ``2 N^2 d``), L-BFGS (per
    evaluation ``4 n N K`` for the loss and its gradient, ``4 K N^2`` for the penalty, and
    ``2 n N d`` where ``Kt`` is recomputed) and the errors (``2 (n + n_test) N d``)."""
    shape = DATASET_SHAPES[dataset]
    n, d, K = shape.n_train, shape.dim, shape.classes
    N = centers_used(spec.n_centers, n)
    try:
        budget = budget_bytes(config["kernel"]["memory_gb"])
        plan = train_plan(n, N, d, K, spec.regularizer, budget, device_kind(config["device"]))
        passes, keep = plan.passes, plan.keep_kernel
    except ValueError:  # does not fit: validation reports it; plan for the slowest case
        passes, keep = 8, False
    kernel = 2 * n * N * d
    build = passes * kernel + 4 * n * N * N if spec.regularizer == "kernel_cl" else 2 * N * N * d
    per_eval = 4 * n * N * K + 4 * K * N * N + (0 if keep else kernel)
    flops = 2 * n * n * d + build + spec.max_iter * EVALS_PER_ITER * per_eval
    flops += 2 * (n + shape.n_test) * N * d
    return flops / FLOPS[device_kind(config["device"])]


def kernel_certify_seconds(config: dict[str, Any], spec: Any, dataset: str) -> float:
    """Estimated seconds of certifying a kernel model: ``certify.n_points`` points (at most
    the test set) x :data:`EVALUATIONS` radii x ``N^2 / 2`` pairs."""
    shape = DATASET_SHAPES[dataset]
    N = centers_used(spec.n_centers, shape.n_train)
    points = min(config["certify"]["n_points"], shape.n_test)
    return points * EVALUATIONS * N * N / 2 / PAIRS_PER_SECOND[device_kind(config["device"])]


def min_norm_walk_steps(config: dict[str, Any], classes: int) -> int:
    """Iterations per point of the minimal-norm L2 attack
    (:func:`crosslip.attacks.min_norm_attack`) at most: ``attack.min_norm_steps`` for each of
    its ``1 + min(targets, K - 1) + restarts`` walks (early stopping and pruning only make
    it fewer); 0 when it is off or L2 is not attacked.
    Each iteration is one forward and one backward pass of the model for one point."""
    at = config["attack"]
    if "l2" not in at["norms"] or at["min_norm_steps"] == 0:
        return 0
    walks = 1 + min(at["min_norm_targets"], classes - 1) + at["min_norm_restarts"]
    return at["min_norm_steps"] * walks


def kernel_attack_seconds(config: dict[str, Any], spec: Any, dataset: str) -> float:
    """Estimated seconds of the attacks on a kernel model: per point, norm and step of the
    search (and of the refinement) one kernel row and the class gradients, ``4 N d K``; per
    point and iteration of the minimal-norm attack a kernel row and its gradient, ``4 N d``."""
    shape = DATASET_SHAPES[dataset]
    N = centers_used(spec.n_centers, shape.n_train)
    at = config["attack"]
    points = min(at["n_points"], shape.n_test)
    steps = at["max_steps"] * (1 + at["refine_steps"])
    flops = points * len(at["norms"]) * steps * 4 * N * shape.dim * shape.classes
    flops += points * min_norm_walk_steps(config, shape.classes) * 4 * N * shape.dim
    return flops / FLOPS[device_kind(config["device"])]


def net_attack_minutes(config: dict[str, Any], spec: Any, dataset: str) -> int:
    """Runtime (minutes) of the attacks on a network: an hour for the paper's search and
    its refinement (as before); with the minimal-norm attack, for a one-hidden-layer net of
    a registered dataset ``4 d H`` flops per point and iteration (a forward and a backward
    pass) at :data:`FLOPS`, times :data:`SAFETY`, at least an hour; a ResNet, a model
    trained elsewhere or a dataset of your own (size unknown here) a day."""
    at = config["attack"]
    if "l2" not in at["norms"] or at["min_norm_steps"] == 0:
        return 60
    if spec is None or dataset not in DATASET_SHAPES or getattr(spec, "arch", "mlp") != "mlp":
        return 24 * 60
    shape = DATASET_SHAPES[dataset]
    points = min(at["n_points"], shape.n_test)
    flops = points * min_norm_walk_steps(config, shape.classes) * 4 * shape.dim * spec.hidden
    return _minutes(flops / FLOPS[device_kind(config["device"])], 60)


def job_resources(config: dict[str, Any], spec: Any, dataset: str, stage: str) -> dict[str, int]:
    """``{"mem_mb", "runtime", "gpu"}`` of the ``stage`` (``train``, ``certify`` or
    ``attack``) job of the model with training spec ``spec`` on ``dataset``, for a validated
    ``config``. ``spec`` None: a model trained elsewhere (config ``external_models``), whose
    certify and attack jobs get the networks' resources."""
    on_gpu = int(config["device"] != "cpu")
    if dataset not in DATASET_SHAPES:  # a dataset of your own: its shape is read by the job
        if not _is_kernel(spec):
            runtime = {"train": 120, "certify": 60}.get(stage) or net_attack_minutes(
                config, spec, dataset
            )
            return {"mem_mb": NET_MEM_MB, "runtime": runtime, "gpu": on_gpu}
        budget_mb = math.ceil(budget_bytes(config["kernel"]["memory_gb"]) / 2**20)
        host = PROCESS_MB + (0 if config["device"].startswith("cuda") else budget_mb)
        return {"mem_mb": host, "runtime": UNKNOWN_SHAPE_MINUTES, "gpu": on_gpu}
    if _is_kernel(spec):
        seconds = {
            "train": kernel_train_seconds,
            "certify": kernel_certify_seconds,
            "attack": kernel_attack_seconds,
        }[stage](config, spec, dataset)
        return {
            "mem_mb": _kernel_mem_mb(config, spec, dataset, stage),
            "runtime": _minutes(seconds, 60),
            "gpu": on_gpu,
        }
    if stage == "attack":
        return {
            "mem_mb": NET_MEM_MB,
            "runtime": net_attack_minutes(config, spec, dataset),
            "gpu": on_gpu,
        }
    if stage != "train":
        return {"mem_mb": NET_MEM_MB, "runtime": 60, "gpu": on_gpu}
    if spec is None:  # a model trained elsewhere has no training job
        return {"mem_mb": NET_MEM_MB, "runtime": 120, "gpu": on_gpu}
    if getattr(spec, "arch", "mlp") == "resnet":
        runtime = 24 * 60
    else:
        samples = spec.epochs * DATASET_SHAPES[dataset].n_train
        factor = 3 if getattr(spec, "setting", "plain") == "adversarial" else 1
        runtime = _minutes(factor * samples * MLP_SECONDS_PER_SAMPLE, 120)
    return {"mem_mb": NET_MEM_MB, "runtime": runtime, "gpu": on_gpu}


def grid_batch_resources(config: dict[str, Any], specs: list[Any], dataset: str) -> dict[str, int]:
    """``{"mem_mb", "runtime", "gpu"}`` of a job that trains the networks ``specs`` of one
    setting as one batched model (:mod:`crosslip.jobs.batches`): the networks' memory (a
    few copies of G sets of weights beside the data), and the sum of their training times,
    per training sample :data:`MLP_SECONDS_PER_SAMPLE` on the CPU and
    :data:`MLP_SECONDS_PER_SAMPLE_CUDA` on a GPU (a batched step costs at most the
    separate steps; docs/performance.md has what it measured)."""
    on_gpu = int(config["device"] != "cpu")
    shape = DATASET_SHAPES.get(dataset)
    n = shape.n_train if shape else 60000  # a dataset of your own: MNIST's size assumed
    per_sample = MLP_SECONDS_PER_SAMPLE_CUDA if on_gpu else MLP_SECONDS_PER_SAMPLE
    seconds = sum(
        (3 if s.setting == "adversarial" else 1) * s.epochs * n * per_sample for s in specs
    )
    weights = sum(s.hidden * (784 if shape is None else shape.dim + shape.classes) for s in specs)
    mem_mb = NET_MEM_MB + math.ceil(16 * BYTES * weights / 2**20)
    return {"mem_mb": mem_mb, "runtime": _minutes(seconds, 120), "gpu": on_gpu}


def job_threads(cores: int | None) -> int:
    """Threads of each training, certify and attack job in a run given ``cores`` (Snakemake's
    resolved ``--cores``: ``None`` where nothing bounds them, as a cluster executor's run or
    ``--report``; a dry run without ``--cores`` counts 1): 2, or 1
    below 4 cores, so that two jobs run side by side rather than one job at a time on all
    cores. A job's products are too small for a second thread to halve them, and its
    start-up and Python work use one thread anyway: on the 2-core machine of
    docs/performance.md the default run's 14 certify and attack jobs took 222 s with one
    thread each, two at a time, against 321 s with two threads each, one at a time.
    ``--set-threads`` still decides per rule."""
    return 2 if cores is None or cores >= 4 else 1

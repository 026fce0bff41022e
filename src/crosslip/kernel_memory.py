"""Memory of the Gaussian-kernel models at scale: chunk plans and estimates, without torch.

Notation: ``n`` training points, ``N`` expansion points (centres, ``N <= n``), ``d`` input
dimension, ``K`` classes; every array is float64 (8 bytes). The dense algorithm holds the
(n, N) kernel matrix ``Kt`` and, for Kernel-CL, several (n, N) and (N, N) temporaries of the
Gram matrix ``M`` (:func:`crosslip.training.kernel.cross_lipschitz_gram`): about 170 GB at
``n = N = 60,000``. The chunked algorithm (:mod:`crosslip.training.kernel`,
:mod:`crosslip.certify.kernel_bounds`) holds instead, in elements:

* training, always: the data ``n d + 2 n`` (points, labels, norms), the centres ``N d + N``
  and L-BFGS with the objective's gradient ``K N (2 h + 16)`` (``h = 20`` pairs of history,
  :data:`LBFGS_WORKING`); then, phase by phase (:func:`_train_phases`):
* the bandwidth: ``b (3 n + d)`` for ``b`` rows of nearest-neighbour distances;
* the penalty matrix ``N^2`` (``M`` for Kernel-CL, ``K_cc`` for Kernel-LogReg), and while
  ``M`` is built ``b N`` for the accumulator of the ``(C C^T) * (Kt^T Kt)`` term over ``b``
  centre rows per pass over the training set (``ceil(N / b)`` passes, at most
  :data:`MAX_PASSES`) and ``c (2 N + d)`` for a chunk of ``c`` kernel rows, its weighted
  copy and the chunk's squares;
* during L-BFGS, beside the penalty matrix: ``n (N + 4 K)`` if ``Kt`` is kept (with the
  logits), else ``c (N + 2 d + 4 K)`` (``Kt`` is recomputed in chunks of ``c`` rows at every
  evaluation of the objective);
* certification (Proposition 2.2): the centres three times, the coefficients twice and
  ``2 N`` norms; per certified point ``N (8 K + 4)``; the tile scratch ``8 m b^2 + 6 b^2``
  for ``m`` points in tiles of ``b x b`` pairs; and, only where they fit, the five pair
  arrays ``5 N^2`` and ``N^2`` per point for ``H``. Without them the tiles are recomputed
  from the centres.

On CUDA, torch allocates more than these arrays (cuBLAS workspaces, the caching allocator's
rounding): :func:`device_reserve_bytes` adds it to every plan for a GPU. The counts are
checked against the peak of torch's CPU allocator in tests/test_kernel_memory.py.

:func:`train_plan` and :func:`certify_plan` turn a budget into chunk sizes;
:func:`config_problems` checks a whole config before any job runs (the Snakefile calls
:func:`check_config` after :func:`crosslip.config.validate.validate`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: Bytes per element (float64).
BYTES = 8
#: Bytes per GiB: ``kernel.memory_gb`` counts in units of 2^30 bytes.
GIB = 2**30
#: L-BFGS history pairs (torch.optim.LBFGS ``history_size``).
LBFGS_HISTORY = 20
#: (K, N) arrays that L-BFGS with the strong-Wolfe line search (torch.optim.LBFGS) and the
#: objective hold besides the history, counted in its source: in ``step`` the flat gradient,
#: the previous one, the direction and the two-loop recursion's vector (4); in
#: ``_strong_wolfe`` the parameters' copy, the gradient's copy, the previous and the new
#: gradient and the two gradients of the bracket (6); the parameters and their gradient (2);
#: the penalty's backward: ``alpha M``, the gradients of the product's two factors and their
#: sum (4). tests/test_kernel_memory.py measured at most 13 in its runs.
LBFGS_WORKING = 16
#: (chunk, K) arrays of the cross-entropy per chunk of training points: the logits, their
#: log-softmax and the two gradients of its backward (measured: 4).
LOGIT_ARRAYS = 4
#: Most passes over the training set while building the Gram matrix of Kernel-CL: each pass
#: recomputes the (n, N) kernel matrix, so the accumulator holds at least ``N / MAX_PASSES``
#: centre rows.
MAX_PASSES = 8
#: Training points per chunk at most (larger chunks do not make the products faster).
MAX_ROWS = 4096
#: Training points per chunk at least (an eighth of them for fewer than 512): thinner
#: products would be too slow to be worth running.
MIN_ROWS = 64
#: Elements of one tile of the Proposition 2.2 evaluation: cache-sized on a CPU (2 MiB),
#: larger on a GPU (128 MiB), where each tile costs a few kernel launches.
TILE_ELEMENTS = {"cpu": 2**18, "cuda": 2**24}
#: Points certified at once at most: with ``H`` stored (one (N, N) array each), and without.
MAX_POINTS_STORED = 8
MAX_POINTS_STREAMED = {"cpu": 16, "cuda": 128}
#: Default bytes of a cuBLAS workspace: 32 MiB, PyTorch's default on GPUs of compute
#: capability 9.0 and later (Hopper, Blackwell); 8 MiB + 128 KiB (``:4096:2:16:8``) on older
#: ones (``parseChosenWorkspaceSize`` in ATen's CublasHandlePool.cpp). PyTorch allocates one
#: per cuBLAS handle and stream through its caching allocator, so
#: ``torch.cuda.max_memory_allocated`` counts it.
CUBLAS_WORKSPACE_DEFAULT = 32 * 2**20
#: Threads that run cuBLAS on the device, each with its own handle and so its own workspace:
#: the job's and autograd's worker thread for the device (backward passes on CUDA run there).
#: On an H100 a Kernel-CL training peaked 64.5 MiB above the plan's arrays as measured on
#: the CPU (tests/test_kernel_scale.py), two 32 MiB workspaces.
CUDA_BLAS_THREADS = 2
#: Bytes by which a block of PyTorch's CUDA caching allocator may exceed its request: a
#: cached block is split only if more than 1 MiB (``kSmallSize``) would remain, and requests
#: are rounded up to 512 bytes.
CUDA_BLOCK_SLACK = 2**20
#: Requests up to this size come from the allocator's small pool (2 MiB segments, split in
#: 512-byte steps): their slack is at most 512 bytes.
CUDA_SMALL_POOL = 2**20
#: Arrays of a training job besides L-BFGS's (K, N) ones that may be larger than the small
#: pool at once: the data, labels, norms, centres, their norms, the picked indices, the
#: penalty matrix, the accumulator or ``Kt``, two chunk buffers and the chunk's temporaries,
#: with margin.
TRAIN_OTHER_ARRAYS = 16
#: Arrays of a certification job that may be larger than the small pool at once (centres
#: twice, the five pair arrays, ``H``, the per-point arrays, fourteen tile buffers), with
#: margin.
CERTIFY_ARRAYS = 40
#: (N, N) arrays of the cached pair data (:class:`crosslip.certify.kernel_bounds.
#: Prop22Shared`): ``-delta^2``, its two rounded-outward copies, ``-4 gamma delta^2`` and
#: ``|mu_rs - mean|^2``; never more than five at once while they are built.
PAIR_ARRAYS = 5


@dataclass(frozen=True)
class DatasetShape:
    """Sizes of a registered dataset: training and test points, dimension, classes."""

    n_train: int
    n_test: int
    dim: int
    classes: int


#: The registered datasets (:mod:`crosslip.data`), by name.
DATASET_SHAPES = {
    "mnist5k": DatasetShape(4000, 1000, 784, 10),
    "mnist": DatasetShape(60000, 10000, 784, 10),
    "cifar10": DatasetShape(50000, 10000, 3072, 10),
    "gtsrb": DatasetShape(39209, 12630, 3072, 43),
}


class KernelMemoryError(ConfigError):
    """A kernel model that does not fit its memory budget; the message says by how much."""


def centers_used(n_centers: int | None, n_train: int) -> int:
    """``N``: ``n_centers`` expansion points, or all ``n_train`` for 0 / None / more."""
    return n_train if not n_centers or n_centers >= n_train else int(n_centers)


def gib(nbytes: float) -> str:
    """``12.3 GiB``."""
    return f"{nbytes / GIB:.1f} GiB"


def gib_up(nbytes: float) -> str:
    """``12.4 GiB`` for 12.31 GiB: a requirement, rounded up to 0.1 GiB."""
    return f"{math.ceil(nbytes / GIB * 10) / 10:.1f} GiB"


def budget_bytes(memory_gb: float) -> int:
    """The budget ``memory_gb`` (GiB) in bytes."""
    return int(memory_gb * GIB)


# --------------------------------------------------------------------------------------
# the device's own allocations
# --------------------------------------------------------------------------------------
def device_kind(device: str) -> str:
    """``cuda`` for ``cuda``, ``cuda:1`` (and ``auto``, which plans for a GPU), else ``cpu``."""
    return "cuda" if str(device).startswith(("cuda", "auto")) else "cpu"


def cublas_workspace_bytes(env: Mapping[str, str] | None = None) -> int:
    """Bytes of one cuBLAS workspace that PyTorch allocates through its CUDA caching allocator
    (``at::cuda::getChosenWorkspaceSize``): ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT``
    pairs, SIZE in KiB) where set, else :data:`CUBLAS_WORKSPACE_DEFAULT`."""
    config = (os.environ if env is None else env).get("CUBLAS_WORKSPACE_CONFIG", "")
    pairs = re.findall(r":(\d+):(\d+)", config)
    if not pairs:
        return CUBLAS_WORKSPACE_DEFAULT
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def device_reserve_bytes(device: str, arrays: int) -> int:
    """What torch allocates on ``device`` besides the plan's arrays, counted by
    ``torch.cuda.max_memory_allocated`` (0 on the CPU): :data:`CUDA_BLAS_THREADS` cuBLAS
    workspaces (:func:`cublas_workspace_bytes`) and :data:`CUDA_BLOCK_SLACK` for each of
    ``arrays`` arrays larger than the allocator's small pool."""
    if device_kind(device) == "cpu":
        return 0
    return CUDA_BLAS_THREADS * cublas_workspace_bytes() + CUDA_BLOCK_SLACK * arrays


# --------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainPlan:
    """Chunk sizes of one kernel training job and what it holds (bytes).

    ``rows``: training points per chunk of kernel rows; ``block``: centre rows of the
    Kernel-CL accumulator per pass (``N``: one pass; unused for Kernel-LogReg); ``keep_kernel``:
    whether ``Kt`` (n, N) stays in memory through L-BFGS; ``knn_rows``: rows per chunk of the
    nearest-neighbour distances (``gamma``); ``device``: ``cpu`` or ``cuda``
    (:func:`device_reserve_bytes`)."""

    n: int
    n_centers: int
    dim: int
    classes: int
    regularizer: str
    budget: int
    rows: int
    block: int
    keep_kernel: bool
    knn_rows: int
    device: str = "cpu"

    @property
    def passes(self) -> int:
        """Passes over the training set that build the Gram matrix (Kernel-CL)."""
        return math.ceil(self.n_centers / self.block) if self.regularizer == "kernel_cl" else 1

    def phases(self) -> dict[str, int]:
        """Elements held in each phase of the job (:func:`_train_phases`)."""
        return _train_phases(
            self.n,
            self.n_centers,
            self.dim,
            self.classes,
            self.regularizer,
            self.rows,
            self.block,
            self.keep_kernel,
            self.knn_rows,
        )

    @property
    def reserve_bytes(self) -> int:
        """What the device allocates besides the arrays (:func:`device_reserve_bytes`)."""
        return _train_reserve(self.n_centers, self.classes, self.device)

    @property
    def peak_bytes(self) -> int:
        """The largest working set of the plan (bytes): its largest phase and the device's
        reserve."""
        return BYTES * max(self.phases().values()) + self.reserve_bytes

    def describe(self) -> dict[str, Any]:
        """The plan as metrics (JSON-serialisable)."""
        return {
            "memory_budget_gib": self.budget / GIB,
            "memory_peak_gib": self.peak_bytes / GIB,
            "memory_device_reserve_gib": self.reserve_bytes / GIB,
            "chunk_rows": self.rows,
            "gram_block_rows": self.block,
            "gram_passes": self.passes,
            "kernel_matrix_kept": self.keep_kernel,
        }


def _train_fixed(n: int, N: int, d: int, K: int) -> int:
    """Elements held through a training job besides the penalty matrix: the points (float64),
    labels and squared norms, the centres and theirs, and L-BFGS with the objective's
    gradient (:data:`LBFGS_HISTORY` pairs and :data:`LBFGS_WORKING` more (K, N) arrays)."""
    return n * d + 2 * n + N * d + N + K * N * (2 * LBFGS_HISTORY + LBFGS_WORKING)


def _row_elements(N: int, d: int, K: int) -> int:
    """Elements per training point of a chunk while L-BFGS recomputes ``Kt`` (and while the
    errors are counted): its kernel row, the point in float64 and its squares (the norm's
    temporary), and :data:`LOGIT_ARRAYS` logits."""
    return N + 2 * d + LOGIT_ARRAYS * K


def _train_phases(
    n: int,
    N: int,
    d: int,
    K: int,
    regularizer: str,
    rows: int,
    block: int,
    keep: bool,
    knn_rows: int,
) -> dict[str, int]:
    """Elements held in each phase of a training job
    (:func:`crosslip.training.kernel.train_kernel`), each with :func:`_train_fixed`:

    * ``bandwidth``: the nearest-neighbour distances of ``knn_rows`` points, a (knn_rows, n)
      buffer and twice that for ``torch.topk``, and the rows' squares;
    * ``penalty``: the (N, N) matrix and, for Kernel-CL, the accumulator (block, N) and two
      (rows, N) chunk buffers (the symmetrization's tiles reuse one), for Kernel-LogReg a
      chunk's squares; the chunk's squares (rows, d);
    * ``lbfgs``: the (N, N) matrix and either ``Kt`` (n, N) with :data:`LOGIT_ARRAYS` (n, K)
      logits (and the squares of a chunk and its float64 copy while ``Kt`` is built), or one
      chunk of :func:`_row_elements`."""
    fixed = _train_fixed(n, N, d, K)
    if regularizer == "kernel_cl":
        penalty = block * N + rows * (2 * N + d)
    else:
        penalty = rows * d
    if keep:
        lbfgs = n * (N + LOGIT_ARRAYS * K) + 2 * rows * d
    else:
        lbfgs = rows * _row_elements(N, d, K)
    return {
        "bandwidth": fixed + knn_rows * (3 * n + d),
        "penalty": fixed + N * N + penalty,
        "lbfgs": fixed + N * N + lbfgs,
    }


def _train_reserve(N: int, K: int, device: str) -> int:
    """The device's reserve of a training job: its large arrays are the (K, N) arrays of
    L-BFGS (where larger than the allocator's small pool) and at most
    :data:`TRAIN_OTHER_ARRAYS` others."""
    kn = 2 * LBFGS_HISTORY + LBFGS_WORKING if BYTES * K * N > CUDA_SMALL_POOL else 0
    return device_reserve_bytes(device, kn + TRAIN_OTHER_ARRAYS)


def _min_block(N: int) -> int:
    return math.ceil(N / MAX_PASSES)


def min_rows(n: int) -> int:
    """The fewest training points per chunk: :data:`MIN_ROWS`, or ``n / 8`` if smaller."""
    return max(1, min(MIN_ROWS, n // 8))


def train_minimum_bytes(
    n: int, N: int, d: int, K: int, regularizer: str, device: str = "cpu"
) -> int:
    """The irreducible working set of a kernel training job on ``device`` (bytes): the data,
    L-BFGS's state, the (N, N) penalty matrix and the smallest chunks (:func:`min_rows`
    kernel rows, the accumulator of ``N / MAX_PASSES`` centre rows, one nearest-neighbour
    row at a time, ``Kt`` recomputed), and the device's reserve."""
    phases = _train_phases(n, N, d, K, regularizer, min_rows(n), _min_block(N), False, 1)
    return BYTES * max(phases.values()) + _train_reserve(N, K, device)


def train_plan(
    n: int, N: int, d: int, K: int, regularizer: str, budget: int, device: str = "cpu"
) -> TrainPlan:
    """Chunk sizes for training within ``budget`` bytes on ``device`` (``cpu``, ``cuda``;
    :func:`device_kind`): as many kernel rows per chunk as a quarter of the free memory
    allows (at most :data:`MAX_ROWS`), then as many accumulator rows as the rest allows
    (one pass if all ``N``), and ``Kt`` kept if it fits next to the penalty matrix.
    Raises :class:`KernelMemoryError` below :func:`train_minimum_bytes`."""
    kind = device_kind(device)
    need = train_minimum_bytes(n, N, d, K, regularizer, kind)
    if need > budget:
        raise KernelMemoryError(
            f"training a {regularizer} model with {N:,} expansion points on {n:,} training "
            f"points needs at least {gib_up(need)} (the (N, N) penalty matrix alone is "
            f"{gib(BYTES * N * N)}); the budget is {gib(budget)}"
        )
    room = (budget - _train_reserve(N, K, kind)) // BYTES - _train_fixed(n, N, d, K)
    free = room - N * N  # elements beside the penalty matrix
    least, row = min_rows(n), _row_elements(N, d, K)
    if regularizer == "kernel_cl":
        rows = max(least, min(n, MAX_ROWS, free // (4 * (2 * N + d))))
        block = min(N, (free - rows * (2 * N + d)) // N)
        if block < _min_block(N):  # fewer rows, so that at most MAX_PASSES passes remain
            block = _min_block(N)
            rows = max(least, min(rows, (free - block * N) // (2 * N + d)))
    else:
        rows = max(least, min(n, MAX_ROWS, free // (4 * row)))
        block = N
    rows = max(least, min(rows, free // row))  # L-BFGS's chunks fit as well
    keep = n * (N + LOGIT_ARRAYS * K) + 2 * rows * d <= free
    knn_rows = max(1, min(n, 1024, room // (3 * n + d)))
    return TrainPlan(
        n, N, d, K, regularizer, budget, int(rows), int(block), keep, int(knn_rows), kind
    )


# --------------------------------------------------------------------------------------
# certification
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CertifyPlan:
    """How Proposition 2.2 is evaluated within a budget: ``cache_pairs`` keeps the (N, N)
    pair arrays, ``store_h`` the (N, N) array ``H`` of each point; ``points`` are certified
    at once in tiles of about ``tile_elements`` elements."""

    n_centers: int
    dim: int
    classes: int
    budget: int
    cache_pairs: bool
    store_h: bool
    points: int
    tile_elements: int
    device: str = "cpu"

    @property
    def reserve_bytes(self) -> int:
        """What the device allocates besides the arrays (:func:`device_reserve_bytes`)."""
        return device_reserve_bytes(self.device, CERTIFY_ARRAYS)

    @property
    def peak_bytes(self) -> int:
        """The largest working set of the plan (bytes), with the device's reserve."""
        N = self.n_centers
        pairs = PAIR_ARRAYS * N * N if self.cache_pairs else 0
        per_point = _point_elements(N, self.classes) + (N * N if self.store_h else 0)
        scratch = _scratch(N, self.tile_elements, self.points)
        work = pairs + self.points * per_point + scratch
        return BYTES * (_certify_fixed(N, self.dim, self.classes) + work) + self.reserve_bytes


def _certify_fixed(N: int, d: int, K: int) -> int:
    """The centres, centred and once more as the squares of the kernel's norm, the
    coefficients and their absolute values, two norms per centre."""
    return 3 * N * d + 2 * K * N + 2 * N


def _point_elements(N: int, K: int) -> int:
    """Elements per certified point besides ``H``: the positive and negative parts of
    ``beta`` in two orders (``4 K N``) and their rows selected for the points still searched
    (``4 K N``; while they are built, ``beta``, its parts and their sum instead), the kernel
    row, ``v`` and two temporaries of the kernel."""
    return N * (8 * K + 4)


def tile_block(N: int, tile: int, points: int) -> int:
    """Side of the square tiles of pairs for ``points`` points at once: about
    ``sqrt(tile / points)``, at least 64 and at most ``N``
    (:class:`crosslip.certify.kernel_bounds.KernelProp22Bound`)."""
    return max(1, min(N, max(64, int((tile / max(points, 1)) ** 0.5))))


def _scratch(N: int, tile: int, points: int) -> int:
    """Elements of the tile buffers: eight (points, b, b) (five float64 bounds, the
    selected or recomputed ``H``, the mask) and six (b, b) pair tiles."""
    block = tile_block(N, tile, points)
    return 8 * points * block * block + 6 * block * block


def certify_minimum_bytes(N: int, d: int, K: int, device: str = "cpu") -> int:
    """The irreducible working set of Proposition 2.2 on ``device`` (bytes): centres,
    coefficients, one point, the smallest tile scratch (tiles of 64 x 64 pairs) and the
    device's reserve."""
    arrays = _certify_fixed(N, d, K) + _point_elements(N, K) + _scratch(N, 64 * 64, 1)
    return BYTES * arrays + device_reserve_bytes(device, CERTIFY_ARRAYS)


def certify_plan(N: int, d: int, K: int, budget: int, device: str = "cpu") -> CertifyPlan:
    """Evaluation of Proposition 2.2 within ``budget`` bytes on ``device`` (``cpu`` or
    ``cuda``): the pair arrays cached if they take at most half the budget, ``H`` stored if
    :data:`MAX_POINTS_STORED` points or fewer fit with it, else streamed tiles for up to
    :data:`MAX_POINTS_STREAMED` points. Raises :class:`KernelMemoryError` below
    :func:`certify_minimum_bytes`."""
    kind = device_kind(device)
    need = certify_minimum_bytes(N, d, K, kind)
    if need > budget:
        raise KernelMemoryError(
            f"certifying a kernel model with {N:,} expansion points needs at least "
            f"{gib_up(need)}; the budget is {gib(budget)}"
        )
    reserve = device_reserve_bytes(kind, CERTIFY_ARRAYS)
    free = (budget - reserve) // BYTES - _certify_fixed(N, d, K)
    per_point = _point_elements(N, K)
    tile = TILE_ELEMENTS[kind]
    while tile > 64 * 64 and _scratch(N, tile, 1) + per_point > free:
        tile //= 4

    def fitting(room: int, most: int, each: int) -> int:
        """Most points (1 to ``most``) whose ``each`` elements and scratch fit ``room``."""
        points = most
        while points > 1 and points * each + _scratch(N, tile, points) > room:
            points -= 1
        return points

    def fits(room: int, points: int, each: int) -> bool:
        return points * each + _scratch(N, tile, points) <= room

    if PAIR_ARRAYS * N * N <= free // 2:  # the pair arrays in half the budget
        room = free - PAIR_ARRAYS * N * N
        stored = fitting(room, MAX_POINTS_STORED, per_point + N * N)
        if fits(room, stored, per_point + N * N):
            return CertifyPlan(N, d, K, budget, True, True, stored, tile, kind)
        points = fitting(room, MAX_POINTS_STREAMED[kind], per_point)
        if fits(room, points, per_point):
            return CertifyPlan(N, d, K, budget, True, False, points, tile, kind)
    points = fitting(free, MAX_POINTS_STREAMED[kind], per_point)
    return CertifyPlan(N, d, K, budget, False, False, points, tile, kind)


# --------------------------------------------------------------------------------------
# the config check
# --------------------------------------------------------------------------------------
def largest_centers(
    n: int, d: int, K: int, regularizer: str, budget: int, device: str = "cpu"
) -> int:
    """The most expansion points (at most ``n``) whose training fits ``budget`` bytes on
    ``device``."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if train_minimum_bytes(n, mid, d, K, regularizer, device) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def config_problems(config: dict[str, Any]) -> list[str]:
    """One line per (dataset, kernel regularizer) of a validated config whose kernel model
    does not fit ``kernel.memory_gb`` on the config's ``device`` (``auto`` counts as a GPU,
    whose reserve the CPU does not need: :func:`device_reserve_bytes`): the estimate in GiB,
    the keys to change (``kernel.n_centers``, ``kernel.memory_gb``, ``datasets``) and the
    most expansion points that fit. Torch-free, so that the Snakefile rejects such a config
    before any job runs (:func:`check_config`)."""
    kern = config.get("kernel", {})
    regs = sorted(kern.get("grid", {}))
    if not regs:
        return []
    memory_gb = kern["memory_gb"]
    budget = budget_bytes(memory_gb)
    kind = device_kind(config.get("device", "auto"))
    lines = []
    for entry in config["datasets"]:
        name = entry if isinstance(entry, str) else entry["name"]
        shape = DATASET_SHAPES.get(name)
        if shape is None:  # a dataset of your own: its shape is known once it is read
            continue
        n, d, K = shape.n_train, shape.dim, shape.classes
        N = centers_used(kern["n_centers"], n)
        for reg in regs:
            need = max(
                train_minimum_bytes(n, N, d, K, reg, kind), certify_minimum_bytes(N, d, K, kind)
            )
            if need <= budget:
                continue
            fit = largest_centers(n, d, K, reg, budget, kind)
            lines.append(
                f"config keys kernel.n_centers ({kern['n_centers']}: {N:,} expansion points "
                f"on {name}), kernel.memory_gb ({memory_gb:g}) and datasets ({name}): "
                f"{reg} needs at least {gib_up(need)} ({N:,} x {N:,} float64 matrix "
                f"{gib(BYTES * N * N)}), more than kernel.memory_gb; raise kernel.memory_gb "
                f"to at least {gib_up(need).removesuffix(' GiB')} on a device that has it, "
                f"or set kernel.n_centers to at most {fit:,}"
            )
    return lines


def check_config(config: dict[str, Any]) -> None:
    """Raise :class:`~crosslip.errors.ConfigError` listing :func:`config_problems`, if any."""
    memory = config_problems(config)
    if memory:
        raise ConfigError("kernel models do not fit kernel.memory_gb:\n" + "\n".join(memory))

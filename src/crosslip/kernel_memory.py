"""Memory of the Gaussian-kernel models at scale: chunk plans and estimates, without torch.

Notation: ``n`` training points, ``N`` expansion points (centres, ``N <= n``), ``d`` input
dimension, ``K`` classes; every array is float64 (8 bytes). The dense algorithm holds the
(n, N) kernel matrix ``Kt`` and, for Kernel-CL, several (n, N) and (N, N) temporaries of the
Gram matrix ``M`` (:func:`crosslip.kernel_train.cross_lipschitz_gram`): about 170 GB at
``n = N = 60,000``. The chunked algorithm (:mod:`crosslip.kernel_train`,
:mod:`crosslip.certify.kernel_bounds`) holds instead, in elements:

* training, always: the data ``n d + 2 n`` (points, labels, norms), the centres ``N d + N``,
  L-BFGS's state ``K N (2 h + 8)`` (``h = 20`` pairs of history) and the penalty matrix
  ``N^2`` (``M`` for Kernel-CL, ``K_cc`` for Kernel-LogReg): the irreducible part;
* while building ``M``: ``b N`` for the accumulator of the ``(C C^T) * (Kt^T Kt)`` term over
  ``b`` centre rows per pass over the training set (``ceil(N / b)`` passes, at most
  :data:`MAX_PASSES`), plus ``2 c N`` for a chunk of ``c`` kernel rows and its weighted copy;
* during L-BFGS: ``n N`` if ``Kt`` is kept, else ``c N`` (``Kt`` is recomputed in chunks of
  ``c`` rows at every evaluation of the objective);
* certification (Proposition 2.2): the centres twice, the coefficients twice and ``N`` norms;
  per certified point ``N (7 K + 2)``; the tile scratch ``8 T + 4 b^2`` for tiles of ``T``
  elements; and, only where they fit, the pair arrays ``3 N^2`` (``4 N^2`` while built) and
  ``N^2`` per point for ``H``. Without them the tiles are recomputed from the centres.

:func:`train_plan` and :func:`certify_plan` turn a budget into chunk sizes;
:func:`config_problems` checks a whole config before any job runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: Bytes per element (float64).
BYTES = 8
#: Bytes per GiB: ``kernel.memory_gb`` counts in units of 2^30 bytes.
GIB = 2**30
#: L-BFGS history pairs (torch.optim.LBFGS ``history_size``).
LBFGS_HISTORY = 20
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
# training
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainPlan:
    """Chunk sizes of one kernel training job and what it holds (bytes).

    ``rows``: training points per chunk of kernel rows; ``block``: centre rows of the
    Kernel-CL accumulator per pass (``N``: one pass; unused for Kernel-LogReg); ``keep_kernel``:
    whether ``Kt`` (n, N) stays in memory through L-BFGS; ``knn_rows``: rows per chunk of the
    nearest-neighbour distances (``gamma``)."""

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

    @property
    def passes(self) -> int:
        """Passes over the training set that build the Gram matrix (Kernel-CL)."""
        return math.ceil(self.n_centers / self.block) if self.regularizer == "kernel_cl" else 1

    @property
    def peak_bytes(self) -> int:
        """The largest working set of the plan (bytes)."""
        n, N = self.n, self.n_centers
        fixed = _train_fixed(n, N, self.dim, self.classes)
        build = self.block * N + 2 * self.rows * N if self.regularizer == "kernel_cl" else 0
        lbfgs = n * N + 3 * n * self.classes if self.keep_kernel else self.rows * N
        knn = 3 * self.knn_rows * n
        return BYTES * max(fixed + N * N + max(build, lbfgs), fixed + knn)

    def describe(self) -> dict[str, Any]:
        """The plan as metrics (JSON-serialisable)."""
        return {
            "memory_budget_gib": self.budget / GIB,
            "memory_peak_gib": self.peak_bytes / GIB,
            "chunk_rows": self.rows,
            "gram_block_rows": self.block,
            "gram_passes": self.passes,
            "kernel_matrix_kept": self.keep_kernel,
        }


def _train_fixed(n: int, N: int, d: int, K: int) -> int:
    """Elements held through a training job besides the penalty matrix."""
    return n * d + 2 * n + N * d + N + K * N * (2 * LBFGS_HISTORY + 8)


def _min_block(N: int) -> int:
    return math.ceil(N / MAX_PASSES)


def min_rows(n: int) -> int:
    """The fewest training points per chunk: :data:`MIN_ROWS`, or ``n / 8`` if smaller."""
    return max(1, min(MIN_ROWS, n // 8))


def train_minimum_bytes(n: int, N: int, d: int, K: int, regularizer: str) -> int:
    """The irreducible working set of a kernel training job (bytes): the data, L-BFGS's
    state, the (N, N) penalty matrix and the smallest chunks (:func:`min_rows` kernel rows;
    for Kernel-CL twice that and the accumulator of ``N / MAX_PASSES`` centre rows)."""
    fixed = _train_fixed(n, N, d, K) + N * N
    rows = min_rows(n)
    work = _min_block(N) * N + 2 * rows * N if regularizer == "kernel_cl" else rows * N
    return BYTES * (fixed + work)


def train_plan(n: int, N: int, d: int, K: int, regularizer: str, budget: int) -> TrainPlan:
    """Chunk sizes for training within ``budget`` bytes: as many kernel rows per chunk as
    a quarter of the free memory allows (at most :data:`MAX_ROWS`), then as many
    accumulator rows as the rest allows (one pass if all ``N``), and ``Kt`` kept if it fits
    next to the penalty matrix. Raises :class:`KernelMemoryError` below
    :func:`train_minimum_bytes`."""
    need = train_minimum_bytes(n, N, d, K, regularizer)
    if need > budget:
        raise KernelMemoryError(
            f"training a {regularizer} model with {N:,} expansion points on {n:,} training "
            f"points needs at least {gib_up(need)} (the (N, N) penalty matrix alone is "
            f"{gib(BYTES * N * N)}); the budget is {gib(budget)}"
        )
    free = budget // BYTES - _train_fixed(n, N, d, K) - N * N  # elements
    least = min_rows(n)
    if regularizer == "kernel_cl":
        rows = max(least, min(n, MAX_ROWS, free // (8 * N)))
        block = min(N, (free - 2 * rows * N) // N)
        if block < _min_block(N):  # fewer rows, so that at most MAX_PASSES passes remain
            block = _min_block(N)
            rows = max(least, min(rows, (free - block * N) // (2 * N)))
    else:
        rows = max(least, min(n, MAX_ROWS, free // (4 * N)))
        block = N
    keep = n * N + 3 * n * K <= free
    knn_rows = max(1, min(n, 1024, (budget // BYTES - _train_fixed(n, N, d, K)) // (3 * n)))
    return TrainPlan(n, N, d, K, regularizer, budget, int(rows), int(block), keep, int(knn_rows))


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

    @property
    def peak_bytes(self) -> int:
        """The largest working set of the plan (bytes)."""
        N = self.n_centers
        pairs = 3 * N * N if self.cache_pairs else 0
        per_point = _point_elements(N, self.classes) + (N * N if self.store_h else 0)
        build = 4 * N * N if self.cache_pairs else 0
        scratch = _scratch(N, self.tile_elements, self.points)
        work = max(pairs + self.points * per_point + scratch, build)
        return BYTES * (_certify_fixed(N, self.dim, self.classes) + work)


def _certify_fixed(N: int, d: int, K: int) -> int:
    return 2 * N * d + 2 * K * N + 2 * N


def _point_elements(N: int, K: int) -> int:
    return N * (7 * K + 2)


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


def certify_minimum_bytes(N: int, d: int, K: int) -> int:
    """The irreducible working set of Proposition 2.2 (bytes): centres, coefficients, one
    point and the smallest tile scratch (tiles of 64 x 64 pairs)."""
    return BYTES * (_certify_fixed(N, d, K) + _point_elements(N, K) + _scratch(N, 64 * 64, 1))


def certify_plan(N: int, d: int, K: int, budget: int, device: str = "cpu") -> CertifyPlan:
    """Evaluation of Proposition 2.2 within ``budget`` bytes on ``device`` (``cpu`` or
    ``cuda``): the pair arrays cached if they take at most half the budget, ``H`` stored if
    :data:`MAX_POINTS_STORED` points or fewer fit with it, else streamed tiles for up to
    :data:`MAX_POINTS_STREAMED` points. Raises :class:`KernelMemoryError` below
    :func:`certify_minimum_bytes`."""
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    need = certify_minimum_bytes(N, d, K)
    if need > budget:
        raise KernelMemoryError(
            f"certifying a kernel model with {N:,} expansion points needs at least "
            f"{gib_up(need)}; the budget is {gib(budget)}"
        )
    free = budget // BYTES - _certify_fixed(N, d, K)
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

    if 6 * N * N <= free // 2:  # the pair arrays (six while built) in half the budget
        room = free - 5 * N * N
        stored = fitting(room, MAX_POINTS_STORED, per_point + N * N)
        if fits(room, stored, per_point + N * N):
            return CertifyPlan(N, d, K, budget, True, True, stored, tile)
        points = fitting(room, MAX_POINTS_STREAMED[kind], per_point)
        if fits(room, points, per_point):
            return CertifyPlan(N, d, K, budget, True, False, points, tile)
    points = fitting(free, MAX_POINTS_STREAMED[kind], per_point)
    return CertifyPlan(N, d, K, budget, False, False, points, tile)


# --------------------------------------------------------------------------------------
# the config check
# --------------------------------------------------------------------------------------
def largest_centers(n: int, d: int, K: int, regularizer: str, budget: int) -> int:
    """The most expansion points (at most ``n``) whose training fits ``budget`` bytes."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if train_minimum_bytes(n, mid, d, K, regularizer) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def config_problems(config: dict[str, Any]) -> list[str]:
    """One line per (dataset, kernel regularizer) of a validated config whose kernel model
    does not fit ``kernel.memory_gb``: the estimate in GiB, the keys to change
    (``kernel.n_centers``, ``kernel.memory_gb``, ``datasets``) and the most expansion points
    that fit. Torch-free, so that :func:`crosslip.config.validate` rejects such a config
    before any job runs."""
    kern = config.get("kernel", {})
    regs = sorted(kern.get("grid", {}))
    if not regs:
        return []
    memory_gb = kern["memory_gb"]
    budget = budget_bytes(memory_gb)
    lines = []
    for entry in config["datasets"]:
        name = entry if isinstance(entry, str) else entry["name"]
        shape = DATASET_SHAPES.get(name)
        if shape is None:  # a dataset of your own: its shape is known once it is read
            continue
        n, d, K = shape.n_train, shape.dim, shape.classes
        N = centers_used(kern["n_centers"], n)
        for reg in regs:
            need = max(train_minimum_bytes(n, N, d, K, reg), certify_minimum_bytes(N, d, K))
            if need <= budget:
                continue
            fit = largest_centers(n, d, K, reg, budget)
            lines.append(
                f"config keys kernel.n_centers ({kern['n_centers']}: {N:,} expansion points "
                f"on {name}), kernel.memory_gb ({memory_gb:g}) and datasets ({name}): "
                f"{reg} needs at least {gib_up(need)} ({N:,} x {N:,} float64 matrix "
                f"{gib(BYTES * N * N)}), more than kernel.memory_gb; raise kernel.memory_gb "
                f"to at least {gib_up(need).removesuffix(' GiB')} on a device that has it, "
                f"or set kernel.n_centers to at most {fit:,}"
            )
    return lines

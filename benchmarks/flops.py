"""The arithmetic floor of a piece of work: its matrix-product flops over the rate at which
the device multiplies matrices.

Every stage of the workflow spends its arithmetic in matrix products: the forward and
backward passes of the one-hidden-layer networks (``U x``, ``W a`` and their gradients),
the Cross-Lipschitz closed form (eq. crosslip, :func:`crosslip.training.regularizers.
cross_lipschitz_closed_form`), the class gradients of the certificates (Proposition 2.3) and
of the attacks (Section 4, :mod:`crosslip.attacks`). Their flops divided by the device's
matrix-product rate in the dtype they run in is a time that no implementation beats by
much; the measured time over it says how much goes to launches, memory traffic and Python
(docs/scaling.md, "The arithmetic floor").

* :func:`count_flops`: the flops of the matrix products that a function dispatches, by
  the dtype they run in (the formulas of ``torch.utils.flop_counter``: ``mm``, ``addmm``,
  ``bmm``, ``baddbmm``, convolutions, attention), whatever the device. Operations replayed
  from a recorded CUDA graph are not dispatched: count a run without one.
* :func:`matmul_rate`: the fastest rate over some product shapes in one dtype, measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from crosslip.device import synchronize

T = TypeVar("T")


class _MatmulFlops(TorchDispatchMode):
    """Adds the flops of every dispatched operator that ``flop_registry`` has a formula
    for to ``flops[dtype name]``, the dtype of its (first) output."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            first = next(t for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            name = str(first.dtype).removeprefix("torch.")
            self.flops[name] = self.flops.get(name, 0) + int(formula(*args, **kwargs, out_val=out))
        return out


def count_flops(fn: Callable[[], T]) -> tuple[T, dict[str, int]]:
    """``(fn(), flops)``: the flops (2 per multiply-add) of the matrix products that ``fn``
    dispatches, forward and backward, by dtype (``{"float32": ..., "float64": ...}``)."""
    counter = _MatmulFlops()
    with counter:
        out = fn()
    return out, dict(sorted(counter.flops.items()))


def matmul_rate(
    shapes: Sequence[tuple[int, int, int]],
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    repeats: int = 3,
) -> float:
    """The fastest rate (flop/s) of an ``(m, k) x (k, n)`` product over ``shapes`` in
    ``dtype`` on ``device``, each timed ``repeats`` times after one warm-up (the device
    synchronised before each clock reading); with torch's matmul settings as they are (on
    CUDA, float32 products use TF32 only where ``torch.backends.cuda.matmul.allow_tf32`` is
    set)."""
    best = 0.0
    gen = torch.Generator(device="cpu").manual_seed(0)
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=gen, dtype=dtype).to(device)
        b = torch.randn(k, n, generator=gen, dtype=dtype).to(device)
        a @ b  # warm-up: the library's handles and kernel choice
        for _ in range(repeats):
            synchronize(device)
            t0 = time.perf_counter()
            a @ b
            synchronize(device)
            best = max(best, 2 * m * k * n / (time.perf_counter() - t0))
    return best

"""Counting the operations that a piece of PyTorch code dispatches: on a GPU each is a kernel
launch, and a step of a small network is bound by launches rather than arithmetic
(docs/scaling.md), so the count is the CPU's measure of what a step will cost there.

:class:`OpCount` counts, inside its ``with`` block, the operations that compute (views,
allocations and detaches left out) and among them those that read a value back to the host
(:func:`host_read`: ``item()`` and friends, the operators whose output shape depends on
values, and indexing with a boolean mask); each of those stalls a GPU until its queue has
run, and none may occur in a step recorded as a CUDA graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Operators whose result goes to Python or whose output shape depends on the values:
#: ``aten._local_scalar_dense`` (``item()``, ``bool()``, ``int()``, ``float()`` of a
#: tensor), ``nonzero``, ``masked_select``, ``unique``, ``repeat_interleave`` with tensor
#: repeats.
HOST_READING_OPS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.nonzero",
        "aten.nonzero_static",
        "aten.masked_select",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.repeat_interleave",
    }
)
#: Indexing operators: with a boolean mask among the indices, the result's shape (or the
#: positions written) is the mask's count of True, read back inside the kernel (the
#: dispatcher shows no ``nonzero`` for it).
INDEXING_OPS = frozenset({"aten.index", "aten.index_put", "aten.index_put_"})
_NOT_COUNTED = ("aten.empty", "aten.detach", "aten._unsafe_view")


def host_read(name: str, args: tuple[Any, ...]) -> str | None:
    """Why the dispatched operator ``name`` (``aten.…``) with ``args`` reads a value back
    to the host, or None if it does not."""
    if name in HOST_READING_OPS:
        return f"{name}: a value read back to the host (or a shape from values)"
    if name in INDEXING_OPS and any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ()
    ):
        return f"{name} with a boolean mask: a shape from values"
    return None


class OpCount(TorchDispatchMode):
    """Counts dispatched operations (module docstring): ``ops`` that compute, and
    ``host_reads`` among them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.host_reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.replace("::", ".")
        if not (func.is_view or name.startswith(_NOT_COUNTED)):
            self.ops += 1
            self.host_reads += host_read(name, args) is not None
        return func(*args, **(kwargs or {}))

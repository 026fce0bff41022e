"""Counting the operations that a piece of PyTorch code dispatches: on a GPU each is a kernel
launch, and a step of a small network is bound by launches rather than arithmetic
(docs/scaling.md), so the count is the CPU's measure of what a step will cost there.

:class:`OpCount` counts, inside its ``with`` block, the operations that compute (views,
allocations and detaches left out) and among them those that read a value back to the host
(:data:`HOST_READING_OPS`: ``item()`` and friends, and the operators whose output shape
depends on values); each of those stalls a GPU until its queue has run, and none may occur
in a step recorded as a CUDA graph.
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

#: Operators whose result goes to Python or whose output shape depends on the values:
#: ``aten._local_scalar_dense`` (``item()``, ``bool()``, ``int()``, ``float()`` of a
#: tensor), ``nonzero`` (boolean-mask indexing runs it), ``masked_select``, ``unique``,
#: ``repeat_interleave`` with tensor repeats.
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
_NOT_COUNTED = ("aten.empty", "aten.detach", "aten._unsafe_view")


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
            self.host_reads += name in HOST_READING_OPS
        return func(*args, **(kwargs or {}))

"""A check that code reads no tensor value back to the host: what a step recorded once and
replayed as a CUDA graph must not do (a graph replays kernels; a value read in Python, or a
shape that depends on values, would be frozen at the recording). On the CPU nothing needs a
copy, so the check looks at the operations themselves:

* the operators whose result goes to Python or whose output shape depends on the values
  (:func:`crosslip.op_count.host_read`): ``aten._local_scalar_dense`` (``item()``,
  ``bool()``, ``int()``, ``float()`` of a tensor), ``nonzero``, ``masked_select``,
  ``unique``, boolean-mask indexing, ``repeat_interleave`` with tensor repeats;
* the Tensor methods that copy to the host: ``tolist``, ``numpy``, ``cpu``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from crosslip.op_count import host_read

HOST_COPYING_METHODS = frozenset({"tolist", "numpy", "cpu"})


class HostReadError(AssertionError):
    """Code that must not read values back to the host did."""


class _Ops(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        why = host_read(func._schema.name.replace("::", "."), args)
        if why is not None:
            raise HostReadError(why)
        return func(*args, **(kwargs or {}))


class _Methods(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_COPYING_METHODS:
            raise HostReadError(f"Tensor.{func.__name__}(): a copy to the host")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    """Fail (:class:`HostReadError`) on any read of a tensor value back to the host inside."""
    with _Methods(), _Ops():
        yield

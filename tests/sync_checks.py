"""A check that code reads no tensor value back to the host: what a step recorded once and
replayed as a CUDA graph must not do (a graph replays kernels; a value read in Python, or a
shape that depends on values, would be frozen at the recording). On the CPU nothing needs a
copy, so the check looks at the operations themselves:

* the operators whose result goes to Python or whose output shape depends on the values
  (:func:`benchmarks.op_count.host_read`): ``aten._local_scalar_dense`` (``item()``,
  ``bool()``, ``int()``, ``float()`` of a tensor), ``nonzero``, ``masked_select``,
  ``unique``, boolean-mask indexing, ``repeat_interleave`` with tensor repeats;
* the Tensor methods that copy to the host: ``tolist``, ``numpy``, ``cpu``.

The other way, a copy *from* the host inside such a step (``torch.tensor(values,
device=...)``, indexing with a Python list, a CPU tensor made lazily and moved) cannot be
told from any other operation on the CPU. :func:`no_host_tensors` therefore runs the step
on the ``meta`` device, where every tensor of the step is a meta tensor, and fails on any
operator that is given a CPU tensor, and on the calls that copy host data into a tensor
wherever it goes (``torch.tensor``, ``as_tensor``, ``asarray`` of lists, numbers or arrays;
an index holding a list or an array): on CUDA each is a copy from pageable host memory,
which a capture refuses (or a value frozen at the recording).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.op_count import host_read

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


class _HostTensors(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                raise HostReadError(
                    f"{func}: given a CPU tensor of shape {tuple(t.shape)} (a copy from the host)"
                )
        return func(*args, **kwargs)


FROM_HOST_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray})
INDEXING = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__})


def _holds_host_data(index: object) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, list | np.ndarray) for i in parts)


class _HostData(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in FROM_HOST_DATA and args and not isinstance(args[0], torch.Tensor):
            raise HostReadError(f"torch.{func.__name__} of host data: a CPU tensor copied")
        if func in INDEXING and len(args) > 1 and _holds_host_data(args[1]):
            raise HostReadError("an index holding a list or an array: a CPU tensor copied")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_tensors() -> Iterator[None]:
    """Fail (:class:`HostReadError`) on any operator given a CPU tensor inside, and on host
    data made into a tensor: for code whose tensors are all on the ``meta`` device (module
    docstring)."""
    with _HostData(), _HostTensors():
        yield

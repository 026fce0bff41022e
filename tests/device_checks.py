"""Checks of device discipline and device memory that run on the CPU (tests/test_devices.py,
tests/test_kernel_memory.py), so that what a GPU would show fails on every run instead.

* :func:`implicit_tensors_on_meta`: run code with torch's default device set to ``meta``.
  A tensor that the code creates without saying where (``torch.zeros(n)``,
  ``torch.as_tensor(array)``, a module built on the default device) is then a meta tensor:
  mixing it with the real CPU tensors, reading it (``.item()``, ``.tolist()``,
  ``.numpy()``) or copying it to another device raises, as a CPU tensor mixed with CUDA
  tensors does on a GPU. Code that means the host says so (``device="cpu"``,
  ``torch.from_numpy``, :func:`crosslip.device.host_tensor`).
* :func:`assert_same`: the comparison of a checked run with a normal one.
* :func:`cpu_peak_bytes`: the peak of the bytes that torch's CPU allocator holds while a
  function runs (every tensor and every temporary inside an operator), from the memory
  events of ``torch.profiler``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

T = TypeVar("T")


@contextlib.contextmanager
def implicit_tensors_on_meta() -> Iterator[None]:
    """Within the block, factory functions without ``device=`` (``torch.zeros``, ``ones``,
    ``full``, ``empty``, ``arange``, ``tensor``, ``as_tensor``, ``rand*``, ``randperm``,
    ``eye``, ``linspace``, ...: ``torch.utils._device._device_constructors()``) and modules
    built without a device create meta tensors. Use it around code that gets real CPU
    tensors and compare the result with a normal run::

        with implicit_tensors_on_meta():
            got = certify(model, x)

    A meta tensor has no data: any use of one that a CUDA device would reject raises
    (``RuntimeError`` or ``NotImplementedError``), and a result that still holds one fails
    the comparison."""
    with torch.device("meta"):
        yield


def assert_same(got: Any, want: Any) -> None:
    """``got`` equals ``want`` value for value (NaN equal to NaN), on the same device:
    tensors, frames, dicts, tuples and lists, dataclasses, plain values; the comparison of a
    check's result with a normal run's."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.device == want.device
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    elif isinstance(want, pd.DataFrame):
        pd.testing.assert_frame_equal(got, want, check_exact=True)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    elif dataclasses.is_dataclass(want):
        assert_same(dataclasses.asdict(got), dataclasses.asdict(want))
    else:
        assert got == want or (got != got and want != want)


def cpu_peak_bytes(fn: Callable[[], T]) -> tuple[T, int]:
    """``(fn(), peak)``: the most bytes torch's CPU allocator held at once while ``fn``
    ran, counted from the allocations and frees that ``torch.profiler`` records
    (``profile_memory=True``), relative to what was held when ``fn`` started (a tensor made
    before and freed inside counts negative: give ``fn`` fresh inputs, such as numpy
    arrays). Runs torch on one thread meanwhile (the profiler records the calling thread's
    allocations)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
    finally:
        torch.set_num_threads(threads)
    events = prof.profiler.kineto_results.events()
    changes = sorted(
        (e.start_ns(), i, e.nbytes()) for i, e in enumerate(events) if e.name() == "[memory]"
    )
    held = peak = 0
    for _, _, nbytes in changes:
        held += nbytes
        peak = max(peak, held)
    return out, peak

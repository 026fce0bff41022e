"""Device selection (``auto`` picks CUDA when available, else CPU) and machine naming."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import numpy as np
import torch

from .errors import ConfigError
from .machine import cpu_model

P = ParamSpec("P")
R = TypeVar("R")


def host_tensor(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """``x`` itself if it is a tensor (on its own device), else a CPU tensor that shares the
    array's memory (``torch.from_numpy``). Unlike ``torch.as_tensor``, an array never lands on
    torch's default device (``torch.set_default_device``, ``with torch.device(...)``): host
    data stays on the host until code moves it where it is needed, explicitly."""
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))


def resolve_device(name: str = "auto") -> torch.device:
    """Map a config value (``auto``, ``cpu``, ``cuda``, ``cuda:1``) to a torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available; use 'auto'")
    return dev


#: The values of config ``device`` and of every benchmark's ``--device``.
DEVICE_CHOICES = ("auto", "cpu", "cuda")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device {auto,cpu,cuda}`` (default ``auto``: CUDA if torch sees one), as every
    benchmark in ``benchmarks/`` takes it; resolve it with :func:`resolve_device`."""
    parser.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default="auto",
        help="torch device (auto: CUDA if torch sees one)",
    )


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the OS has one (under SLURM,
    the job's cores rather than the node's), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS, Windows)
        return os.cpu_count() or 1


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: torch's CPU threads, as every benchmark in ``benchmarks/`` takes it
    (default: :func:`available_cpus`). One thread suits a machine that is busy with other
    work, where torch's idle threads spin on shared cores."""
    parser.add_argument(
        "--threads",
        type=int,
        default=available_cpus(),
        metavar="N",
        help="torch CPU threads (default: the CPUs this process may run on)",
    )


def describe_machine(device: torch.device | str = "cpu") -> str:
    """One line naming the hardware, for benchmark output: the CPU model (from
    ``/proc/cpuinfo`` where there is one), its core count, torch's version and thread count,
    and the GPU if ``device`` is a CUDA device."""
    threads = torch.get_num_threads()
    text = f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}"
    text += f" on {threads} thread{'' if threads == 1 else 's'}"
    dev = torch.device(device)
    if dev.type == "cuda":
        text += f", {torch.cuda.get_device_name(dev)}"
    return text


def device_memory_bytes(device: torch.device | str) -> int | None:
    """Total memory of ``device``: the GPU's for CUDA, the machine's RAM for the CPU (None
    where unknown)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_device_memory(device: torch.device | str, memory_gb: float | None) -> None:
    """Stop a kernel job whose budget ``kernel.memory_gb`` exceeds its device's memory, with
    a message that names the key, instead of running out of memory hours later."""
    total = device_memory_bytes(device)
    if memory_gb is None or total is None or memory_gb * 2**30 <= total:
        return
    raise ConfigError(
        f"config key kernel.memory_gb ({memory_gb:g}) exceeds the memory of device {device} "
        f"({total / 2**30:.1f} GiB); lower kernel.memory_gb (and kernel.n_centers with it) or "
        "run the job on a device that has the memory"
    )


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """Within the block, float32 matrix products (cuBLAS) and convolutions (cuDNN) on CUDA
    may round their inputs to TF32 (10-bit mantissas, float32 sums) where ``enabled``, and
    round as IEEE float32 where not; both settings restored after. PyTorch's defaults are
    off for products and on for convolutions. No effect on the CPU or in float64."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def in_tf32(enabled: Callable[..., bool]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: the function runs within :func:`tf32` of ``enabled(*args, **kwargs)``,
    the setting read from its own arguments (a training from its config)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            with tf32(enabled(*args, **kwargs)):
                return fn(*args, **kwargs)

        return inner

    return wrap


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (CUDA runs asynchronously): call it before
    reading a clock, so that a timing covers the computation, not its launch. A no-op on the
    CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)

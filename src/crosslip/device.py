"""Device selection (``auto`` picks CUDA when available, else CPU) and machine naming."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from .errors import ConfigError


def resolve_device(name: str = "auto") -> torch.device:
    """Map a config value (``auto``, ``cpu``, ``cuda``, ``cuda:1``) to a torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available; use 'auto'")
    return dev


def describe_machine(device: torch.device | str = "cpu") -> str:
    """One line naming the hardware, for benchmark output: the CPU model (from
    ``/proc/cpuinfo`` where there is one), its core count, torch's version, and the GPU if
    ``device`` is a CUDA device."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}"
    dev = torch.device(device)
    if dev.type == "cuda":
        text += f", {torch.cuda.get_device_name(dev)}"
    return text


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (CUDA runs asynchronously): call it before
    reading a clock, so that a timing covers the computation, not its launch. A no-op on the
    CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)

"""Device selection: ``auto`` picks CUDA when available, else CPU."""

from __future__ import annotations

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """Map a config value (``auto``, ``cpu``, ``cuda``, ``cuda:1``) to a torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available; use 'auto'")
    return dev

"""The machine and the checkout a result comes from, found once for every record that names
them: the benchmarks' lines and records (``crosslip.device.describe_machine``,
``benchmarks/perfdoc.py``) and the reproduction record's run folders
(:mod:`crosslip.reproduction.export`).

Torch-free: torch is imported only to name a GPU, and only when it is installed.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def _proc(path: str, key: str) -> str | None:
    """The value of the first line ``key: value`` of ``path`` (``None`` where there is none)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(key)), None)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what :mod:`platform` says)."""
    return _proc("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def machine_description() -> dict[str, Any]:
    """The machine running this: CPU model and logical CPUs (``/proc/cpuinfo``; ``cpu`` is
    ``None`` without it), memory in GiB (``/proc/meminfo``), and the CUDA GPU torch sees
    (``None`` without torch or GPU)."""
    mem = _proc("/proc/meminfo", "MemTotal:")  # in kB
    mem = None if mem is None else round(int(mem.split()[0]) / 2**20, 1)
    gpu = None
    try:
        import torch  # lazily: the module stays importable without torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    cpu = _proc("/proc/cpuinfo", "model name")
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "memory_gib": mem, "gpu": gpu}


def _git(root: Path, *args: str) -> str | None:
    """``git -C root <args>``'s output, ``None`` when git fails (or outside a checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def git_commit(root: Path, ref: str = "HEAD") -> str | None:
    """The full commit ``ref`` names in the checkout at ``root`` (``None`` where it names
    none, or outside a git checkout)."""
    return _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


def git_state(root: Path) -> dict[str, Any]:
    """``{"commit": <HEAD>, "dirty": <uncommitted changes to tracked files>}`` of the checkout
    at ``root`` (``None`` values outside a git checkout)."""
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": git_commit(root), "dirty": None if status is None else bool(status)}

"""Which trained models get certified and attacked (``certify.models`` in the config).

The paper evaluates the kernel models' guarantees "only for the optimal parameters" and
reports the best model of each method; :func:`select_best` picks, after training, the model
with the lowest test error per dataset, model family, setting and method (ties broken by the
model id, so the choice is reproducible). Methods are the regularizers, with the
unregularized Kernel-LogReg (lambda = 0, the kernel table's "No Reg.") a method of its own.
Diverged models are never chosen. Torch-free: the workflow runs it as a checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..families import model_family
from ..io.files import atomic_path


def method_of(cfg: dict[str, Any]) -> str:
    """The regularizer, or ``kernel_noreg`` for Kernel-LogReg with lambda = 0."""
    if cfg["regularizer"] == "kernel_logreg" and float(cfg["lam"]) == 0:
        return "kernel_noreg"
    return str(cfg["regularizer"])


def select_best(metrics: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(dataset, model_id) of the lowest-test-error model per dataset x family x setting x
    method, among the models whose training finished (``status == "ok"``), sorted."""
    best: dict[tuple[str, ...], tuple[float, str, str]] = {}
    for met in metrics:
        if met.get("status") != "ok" or met.get("test_error") is None:
            continue
        cfg = met["config"]
        group = (met["dataset"], model_family(cfg), cfg.get("setting", "plain"), method_of(cfg))
        cand = (float(met["test_error"]), met["model_id"], met["dataset"])
        if group not in best or cand < best[group]:
            best[group] = cand
    return sorted((ds, model_id) for _, model_id, ds in best.values())


def write_selected(chosen: list[tuple[str, str]], path: Path | str) -> None:
    """Write the chosen models as JSON ``{"models": [[dataset, model_id], ...]}``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"models": [list(c) for c in chosen]}, indent=1) + "\n")


def read_selected(path: Path | str) -> list[tuple[str, str]]:
    """The (dataset, model_id) pairs written by :func:`write_selected`."""
    return [(ds, m) for ds, m in json.loads(Path(path).read_text())["models"]]

"""The attack stage: box-constrained adversarial samples, upper bounds (Section 4)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..attacks import min_norm_attack, refine_upper_bound, upper_bound
from ..attacks.settings import AttackSettings, attack_settings_with
from ..data import read_class_names
from ..device import resolve_device
from ..io.files import atomic_path, read_json
from ..io.logs import about_model
from ..models.external import load_stored
from ..norms import norm_p
from ..results_schema import ATTACK_COLUMNS, L2_UPPER_METHODS, upper_bound_column
from .common import best_of, eval_points
from .parquet import empty_frame, write_parquet


def attack_stage(
    data: Path | str,
    model: Path | str,
    metrics: Path | str,
    out: Path | str,
    settings: AttackSettings | None = None,
    examples_out: Path | str | None = None,
    **changes: Any,
) -> pd.DataFrame:
    """Upper bounds (Section 4) for the ``settings.n_points`` eval points with ``settings``
    (default: the schema's; keyword ``changes`` apply on top, ``min_norm_<field>`` for the
    minimal-norm attack's), per norm of ``settings.norms``: the paper's search
    (``upper_bound_{p}``; for L2 the column ``upper_bound`` with its target and class) and
    the refinement by re-linearization (``upper_bound_{p}_refined``) and the minimal-norm
    attack in that norm (:func:`crosslip.attacks.min_norm_attack` with
    ``settings.min_norm``, started from the refined samples; ``upper_bound_{p}_min_norm``,
    null throughout with ``min_norm.steps`` 0). For L2 also the smallest of the three L2
    bounds with the method that gave it (:func:`best_l2_upper_bound`). Failed attacks are
    null (``attack_success`` says which, for the L2 paper procedure).

    ``examples_out`` (``.npz``) receives the L2 adversarial samples of the paper's procedure
    for the first ``settings.n_examples`` eval points (``m`` of them), the candidates of the
    illustration figure: ``test_index``, ``label`` (the true class), ``x``, ``delta``, ``adv``
    (each (m, d)), ``pred``, ``adv_class``, ``norm``, ``success`` (each (m,)), the image
    ``shape`` and the dataset's ``class_names``; no samples for a diverged model."""
    settings = attack_settings_with(settings, changes)
    rtol, max_steps, norms = settings.rtol, settings.max_steps, settings.norms
    met = read_json(metrics)
    idx, x, y, shape = eval_points(data, settings.n_points, met)
    examples: dict[str, np.ndarray] = {}
    if met["status"] != "ok":
        df = empty_frame(ATTACK_COLUMNS)
    else:
        dev = resolve_device(settings.device)
        net = load_stored(model, met["config"].get("format"))
        xd = x.to(dev)
        t0 = time.perf_counter()
        df = pd.DataFrame({"test_index": idx})
        for name in norms:
            p = norm_p(name)
            ub = upper_bound(net, xd, p=p, rtol=rtol, max_steps=max_steps)
            ref = refine_upper_bound(
                net, xd, ub, p=p, steps=settings.refine_steps, rtol=rtol, max_steps=max_steps
            )
            df[upper_bound_column(name)] = np.where(ub.success.numpy(), ub.norm.numpy(), np.nan)
            df[f"upper_bound_{name}_refined"] = np.where(
                ref.success.numpy(), ref.norm.numpy(), np.nan
            )
            if settings.min_norm.steps > 0:
                mn = min_norm_attack(net, xd, start=ref, settings=settings.min_norm, p=p)
                found = np.where(mn.success.numpy(), mn.norm.numpy(), np.nan)
                df[f"upper_bound_{name}_min_norm"] = found
            if name == "l2":
                df["upper_bound_l2_best"], df["upper_bound_l2_best_method"] = best_l2_upper_bound(
                    df
                )
                df["attack_success"] = ub.success.numpy()
                df["attack_target"] = ub.target.numpy()
                df["adv_class"] = ub.adv_class.numpy()
                m = min(settings.n_examples, len(idx))
                examples = {
                    "test_index": idx[:m],
                    "label": np.asarray(y[:m], dtype=np.int64),
                    "x": x[:m].numpy(),
                    "delta": ub.delta[:m].cpu().numpy(),
                    "adv": (x[:m].double() + ub.delta[:m].cpu()).numpy(),
                    "pred": ub.pred[:m].numpy(),
                    "adv_class": ub.adv_class[:m].numpy(),
                    "norm": ub.norm[:m].numpy(),
                    "success": ub.success[:m].numpy(),
                }
        df["attack_seconds"] = (time.perf_counter() - t0) / max(len(idx), 1)
        df = df.reindex(columns=ATTACK_COLUMNS)
        if "l2" not in norms:
            df["attack_success"] = False
            df[["attack_target", "adv_class"]] = -1
            df["upper_bound_l2_best_method"] = None
    write_parquet(df, out)
    if examples_out is not None:
        with atomic_path(examples_out) as tmp, open(tmp, "wb") as fh:
            np.savez(
                fh,
                shape=np.asarray(shape, dtype=np.int64),
                class_names=read_class_names(data),
                **examples,
            )
    return df


def attack_models_stage(
    data: Path | str,
    models: Sequence[tuple[str, Path | str, Path | str, Path | str, Path | str]],
    settings: AttackSettings | None = None,
) -> dict[str, pd.DataFrame]:
    """:func:`attack_stage` with ``settings`` for each ``(model id, model file, metrics
    file, output table, examples file)`` of ``models``, in this one process (config
    ``attack.batch_models``); each model's lines go to its own log
    (:func:`crosslip.io.logs.about_model`)."""
    out = {}
    for model_id, model, metrics, table, examples in models:
        with about_model(model_id):
            out[model_id] = attack_stage(data, model, metrics, table, settings, examples)
    return out


def best_l2_upper_bound(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``df``, the smallest of its L2 upper bounds
    (:data:`~crosslip.results_schema.L2_UPPER_METHODS`; a column that is absent or null
    did not run or failed) and the name of the method that gave it, the earlier one on a
    tie; NaN and None where none succeeded. Every bound is a verified adversarial sample,
    so the minimal adversarial perturbation lies between the guarantee and this."""
    return best_of(df, L2_UPPER_METHODS, largest=False)

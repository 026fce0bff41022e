"""The schema of the per-instance results and the column groups built on it.

One row per evaluated test point per model (Section 5's experiments): the model's
identifying columns (:data:`MODEL_KEYS`), the certification stage's columns
(:data:`CERTIFY_COLUMNS`: prediction, margin and the guarantees of Theorem 2.1), the attack
stage's columns (:data:`ATTACK_COLUMNS`: the upper bounds of Section 4), and two derived ones
(``correct``, ``ratio_global_local``, ``exact_<norm>``). :data:`INSTANCE_SCHEMA` fixes
names, order and types;
every other list of columns in the package is built from the groups here.

Only pyarrow is needed (no torch), so that the report reads the results without loading the
engines.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .families import EXTERNAL, model_family
from .norms import NORMS

#: Certificates beyond the paper's bounds, per p-norm (``crosslip.certify.engine.METHOD_KINDS``):
#: Theorem 2.1 integrated along the ray, the linear relaxation, the curvature bound.
GUARANTEE_METHODS = ("integrated", "linear", "curvature")
#: Their columns and the largest sound certificate per norm, ``guarantee_{norm}_{method}``
#: and ``guarantee_{norm}_best``; then the same inside the box (``..._box``).
BEYOND_COLUMNS = [
    f"guarantee_{norm}_{method}{box}"
    for box in ("", "_box")
    for norm in ("l2", "l1", "linf")
    for method in (*GUARANTEE_METHODS, "best")
]
#: The L2 guarantees per method, in the order in which a tie goes to the earlier one: the
#: paper's (Proposition 2.3), Theorem 2.1 with the tightest of the bounds on the Lipschitz
#: constant, and the certificates beyond the paper. ``guarantee_l2_best`` is their maximum
#: per point and ``guarantee_l2_best_method`` the method that gave it.
L2_GUARANTEE_METHODS = {
    "paper": "guarantee_local",
    "min_bound": "guarantee_l2",
    **{m: f"guarantee_l2_{m}" for m in GUARANTEE_METHODS},
}

#: Schema of the per-instance results: one row per evaluated test point per model.
INSTANCE_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("model_id", pa.string()),
        ("family", pa.string()),
        ("regularizer", pa.string()),
        ("lr", pa.float64()),
        ("lam", pa.float64()),
        ("kernel_a", pa.float64()),
        ("seed", pa.int64()),
        ("setting", pa.string()),
        ("status", pa.string()),
        ("test_error", pa.float64()),
        ("test_index", pa.int64()),
        ("label", pa.int64()),
        ("pred", pa.int64()),
        ("correct", pa.bool_()),
        ("float32_agrees", pa.bool_()),
        ("margin", pa.float64()),
        ("local_bound", pa.string()),
        ("guarantee_local", pa.float64()),
        ("radius_local", pa.float64()),
        ("bound_class", pa.int64()),
        ("guarantee_global", pa.float64()),
        ("ratio_global_local", pa.float64()),
        ("guarantee_l2", pa.float64()),
        ("guarantee_l1", pa.float64()),
        ("guarantee_linf", pa.float64()),
        ("guarantee_l2_box", pa.float64()),
        ("guarantee_l1_box", pa.float64()),
        ("guarantee_linf_box", pa.float64()),
        *[(c, pa.float64()) for c in BEYOND_COLUMNS],
        ("guarantee_l2_best_method", pa.string()),
        ("upper_bound", pa.float64()),
        ("attack_success", pa.bool_()),
        ("attack_target", pa.int64()),
        ("adv_class", pa.int64()),
        ("upper_bound_l2_refined", pa.float64()),
        ("upper_bound_l2_min_norm", pa.float64()),
        ("upper_bound_l2_best", pa.float64()),
        ("upper_bound_l1", pa.float64()),
        ("upper_bound_l1_refined", pa.float64()),
        ("upper_bound_l1_min_norm", pa.float64()),
        ("upper_bound_linf", pa.float64()),
        ("upper_bound_linf_refined", pa.float64()),
        ("upper_bound_linf_min_norm", pa.float64()),
        ("upper_bound_l2_best_method", pa.string()),
        ("certify_seconds", pa.float64()),
        ("attack_seconds", pa.float64()),
        ("exact_l2", pa.bool_()),
        ("exact_l1", pa.bool_()),
        ("exact_linf", pa.bool_()),
    ]
)

#: Identifying columns of a model (:func:`model_keys`), shared by the per-instance results
#: and the summary tables: the schema's columns up to ``test_error``.
MODEL_KEYS = INSTANCE_SCHEMA.names[: INSTANCE_SCHEMA.names.index("test_error") + 1]

#: Guarantees (certified radii) that the summary averages over correctly classified
#: points: the local L2 bound (Proposition 2.3 or 2.2), the global L2 bound and their ratio
#: (Table 1), the tightest L2, L1 and Linf guarantees of Theorem 2.1, the same inside the
#: box [0, 1]^d, and the certificates beyond the paper with the best per norm.
MEAN_COLUMNS = [
    "guarantee_local",
    "guarantee_global",
    "ratio_global_local",
    "guarantee_l2",
    "guarantee_l1",
    "guarantee_linf",
    "guarantee_l2_box",
    "guarantee_l1_box",
    "guarantee_linf_box",
    *BEYOND_COLUMNS,
]
#: Guarantee columns written by the certification stage (NaN where a kind was not requested
#: or does not exist for the model family): the guarantees of :data:`MEAN_COLUMNS` except
#: the ratio (computed when the results are joined), with the local bound's radius R and the
#: class j attaining it.
GUARANTEE_COLUMNS = [
    "guarantee_local",
    "radius_local",
    "bound_class",
    *[c for c in MEAN_COLUMNS if c.startswith("guarantee_") and c != "guarantee_local"],
]
#: Upper bounds (Section 4) besides the L2 paper procedure's ``upper_bound``: its
#: refinement by re-linearization, the minimal-norm L2 attack
#: (:func:`crosslip.attacks.min_norm_attack`), the smallest of the three L2 bounds, the L1
#: and Linf searches, their refinements and minimal-norm attacks; the summary averages each
#: over its successful attacks.
UPPER_COLUMNS = [
    "upper_bound_l2_refined",
    "upper_bound_l2_min_norm",
    "upper_bound_l2_best",
    "upper_bound_l1",
    "upper_bound_l1_refined",
    "upper_bound_l1_min_norm",
    "upper_bound_linf",
    "upper_bound_linf_refined",
    "upper_bound_linf_min_norm",
]
#: Columns written by the certification stage, in order.
CERTIFY_COLUMNS = [
    "test_index",
    "label",
    "pred",
    "float32_agrees",
    "margin",
    "local_bound",
    *GUARANTEE_COLUMNS,
    "guarantee_l2_best_method",
    "certify_seconds",
]
#: The L2 upper bounds per method, in the order in which a tie goes to the earlier one: the
#: paper's procedure, its refinement, the minimal-norm attack. ``upper_bound_l2_best`` is
#: their minimum per point and ``upper_bound_l2_best_method`` the method that gave it.
L2_UPPER_METHODS = {
    "paper": "upper_bound",
    "refined": "upper_bound_l2_refined",
    "min_norm": "upper_bound_l2_min_norm",
}
#: Columns written by the attack stage, in order: the L2 paper procedure's bound, whether it
#: succeeded, its target and the class reached, then :data:`UPPER_COLUMNS` and the method of
#: the best L2 bound.
ATTACK_COLUMNS = [
    "test_index",
    "upper_bound",
    "attack_success",
    "attack_target",
    "adv_class",
    *UPPER_COLUMNS,
    "upper_bound_l2_best_method",
    "attack_seconds",
]

#: Columns computed when the two stages' results are joined (:func:`crosslip.pipeline.
#: instances_stage`): whether the prediction is right, ``guarantee_global /
#: guarantee_local`` where the local guarantee is positive (Table 1), and per norm whether
#: the best certificate is within 1% of the best upper bound (the minimal adversarial
#: perturbation known to 1%: :func:`crosslip.certified_accuracy.exact_points`).
JOINED_COLUMNS = ["correct", "ratio_global_local", "exact_l2", "exact_l1", "exact_linf"]


def upper_bound_column(norm: str) -> str:
    """Column of the paper's upper bound (Section 4) in the norm named ``norm``:
    ``upper_bound`` for L2 (the paper's figures), else ``upper_bound_l1`` or
    ``upper_bound_linf`` (its refinement is always ``upper_bound_{norm}_refined``)."""
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; allowed: {', '.join(NORMS)}")
    return "upper_bound" if norm == "l2" else f"upper_bound_{norm}"


def model_keys(met: dict[str, Any], model_id: str) -> dict[str, Any]:
    """The identifying columns of a model (:data:`MODEL_KEYS`, in order) from its metrics:
    kernel models have no ``lr`` and networks no ``kernel_a`` (NaN); kernel models train in
    the plain setting. ``lam`` is the regularizer's grid value: lambda, or for dropout the
    probability ``keep_hidden`` of keeping a hidden unit. A model trained elsewhere
    (family ``external``) has regularizer ``external``, no ``lr``, ``lam``, ``kernel_a``
    (NaN), seed -1 and setting ``plain`` (evaluated on the full test images)."""
    cfg = met["config"]
    if model_family(cfg) == EXTERNAL:
        nan = float("nan")
        return {
            "dataset": met["dataset"],
            "model_id": model_id,
            "family": EXTERNAL,
            "regularizer": EXTERNAL,
            "lr": nan,
            "lam": nan,
            "kernel_a": nan,
            "seed": -1,
            "setting": "plain",
            "status": met["status"],
            "test_error": met["test_error"],
        }
    return {
        "dataset": met["dataset"],
        "model_id": model_id,
        "family": model_family(cfg),
        "regularizer": cfg["regularizer"],
        "lr": float("nan") if cfg.get("lr") is None else float(cfg["lr"]),
        "lam": float(cfg["keep_hidden"] if cfg["regularizer"] == "dropout" else cfg["lam"]),
        "kernel_a": float(cfg["a"]) if "a" in cfg else float("nan"),
        "seed": int(cfg["seed"]),
        "setting": cfg.get("setting", "plain"),
        "status": met["status"],
        "test_error": met["test_error"],
    }

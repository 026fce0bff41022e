"""Certified accuracy at a fixed radius: the number the certified-robustness field compares
methods by, and the attack's bound on it.

At radius ``eps`` in the p-norm, over *all* evaluated test points of a model (the rows with
a prediction, i.e. certified; rows that only an attack reached do not count, so that both
shares are over the same points whatever ``attack.n_points``):

* ``certified_accuracy_<norm>_<eps>``: the share that is classified correctly and whose best
  sound certificate ``guarantee_<norm>_best`` is at least ``eps`` (the ball, not the box, as
  the field reports it);
* ``attack_accuracy_<norm>_<eps>``: the share that is classified correctly and that no
  verified adversarial sample within ``eps`` breaks: the best upper bound is above ``eps``,
  or no attack of that norm found a sample. It bounds the certified accuracy from above,
  since a certificate never exceeds an upper bound.

An evaluated point that has no certificate of the norm (NaN) counts as not certified, one
without an attack result of the norm as not broken. A model without any certificate of a
norm (the norm not certified) has NaN in that norm's certified columns, and one without any
attack result of the norm NaN in its attack columns.

Torch-free (pandas and numpy), so the summary and the figures read it alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from .config.schema import default
from .norms import NORMS

#: The schema's radii per norm (``certify.radii``).
DEFAULT_RADII: dict[str, list[float]] = {n: default(f"certify.radii.{n}") for n in NORMS}

#: The best upper bound's columns per norm: their minimum per point is the best bound.
UPPER_BOUND_COLUMNS = {
    "l2": ("upper_bound_l2_best",),
    "l1": ("upper_bound_l1", "upper_bound_l1_refined", "upper_bound_l1_min_norm"),
    "linf": ("upper_bound_linf", "upper_bound_linf_refined", "upper_bound_linf_min_norm"),
}


def radius_text(eps: float) -> str:
    """A radius as column names write it: ``1.58``, ``0.5``, ``1`` (``%g``)."""
    return f"{eps:g}"


def accuracy_columns(radii: Mapping[str, Sequence[float]]) -> list[str]:
    """The summary's columns for ``radii`` (norm -> radii, in the order of :data:`NORMS`):
    per norm and radius, the certified and then the attack's accuracy."""
    unknown = set(radii) - set(NORMS)
    if unknown:
        raise ValueError(f"unknown norms {sorted(unknown)}; allowed: {', '.join(NORMS)}")
    return [
        f"{kind}_accuracy_{norm}_{radius_text(eps)}"
        for norm in NORMS
        for eps in radii.get(norm, ())
        for kind in ("certified", "attack")
    ]


def best_guarantee(instances: pd.DataFrame, norm: str) -> pd.Series:
    """The best sound certificate of each row in ``norm`` (NaN where there is none)."""
    col = f"guarantee_{norm}_best"
    if col not in instances:
        return pd.Series(np.nan, index=instances.index)
    return instances[col].astype(float)


def bracket_guarantee(instances: pd.DataFrame, norm: str) -> pd.Series:
    """The best certificate of each row in ``norm`` for the set that the attacks search:
    the ball in the box ``[0, 1]^d`` (every attack keeps its samples there), so the larger
    of ``guarantee_<norm>_best_box`` and the ball's (valid in the box too); the ball's alone
    where the run has no box certificates. With :func:`best_upper_bound` it brackets the
    minimal adversarial perturbation that stays in the box."""
    ball = best_guarantee(instances, norm)
    col = f"guarantee_{norm}_best_box"
    if col not in instances:
        return ball
    return pd.concat([ball, instances[col].astype(float)], axis=1).max(axis=1, skipna=True)


def best_upper_bound(instances: pd.DataFrame, norm: str) -> pd.Series:
    """The smallest verified upper bound of each row in ``norm`` (NaN where no attack of
    that norm found a sample)."""
    cols = [c for c in UPPER_BOUND_COLUMNS[norm] if c in instances]
    if not cols:
        return pd.Series(np.nan, index=instances.index)
    return instances[cols].astype(float).min(axis=1, skipna=True)


#: A certificate within this share of the best upper bound closes the bracket: the minimal
#: adversarial perturbation is known to 1%.
EXACT_RTOL = 0.01


def exact_points(instances: pd.DataFrame, norm: str) -> pd.Series:
    """Per row, whether the best certificate in ``norm`` of the set the attacks search
    (:func:`bracket_guarantee`) is at least ``1 - EXACT_RTOL`` times the best upper bound
    (nullable boolean: null where either is missing)."""
    cert, upper = bracket_guarantee(instances, norm), best_upper_bound(instances, norm)
    known = cert.notna() & upper.notna()
    exact = (cert >= (1 - EXACT_RTOL) * upper).astype(object)
    return exact.where(known, None)


def share_exact(instances: pd.DataFrame, norm: str) -> float:
    """The share of the correctly classified rows whose ``exact_<norm>`` is true (a row
    without an upper bound counts as not exact); NaN without any correct row or any
    certificate of the norm."""
    ok = instances[instances["correct"].fillna(False).astype(bool)]
    if not len(ok) or bracket_guarantee(ok, norm).isna().all():
        return float("nan")
    return float((exact_points(ok, norm) == True).mean())  # noqa: E712 (null is not exact)


def attacked(instances: pd.DataFrame, norm: str) -> bool:
    """Whether any row has an upper bound in ``norm`` (else the norm was not attacked)."""
    return bool(best_upper_bound(instances, norm).notna().any())


def _correct(instances: pd.DataFrame) -> np.ndarray:
    return instances["correct"].fillna(False).astype(bool).to_numpy()


def evaluated(instances: pd.DataFrame) -> pd.DataFrame:
    """The rows with a prediction (the certification stage's points)."""
    if "pred" not in instances:
        return instances
    return instances[instances["pred"].notna()]


def certified_share(instances: pd.DataFrame, norm: str, radii: np.ndarray) -> np.ndarray:
    """Certified accuracy of one model's rows at each radius of ``radii`` (m,), over its
    evaluated rows (NaN for every radius if no row has a certificate in ``norm``)."""
    radii = np.asarray(radii, dtype=float)
    instances = evaluated(instances)
    best = best_guarantee(instances, norm).to_numpy()
    if not len(instances) or np.isnan(best).all():
        return np.full(radii.shape, np.nan)
    ok = _correct(instances) & ~np.isnan(best)
    good = np.where(ok, best, -np.inf)
    return (good[None, :] >= radii[:, None]).mean(axis=1)


def attack_share(instances: pd.DataFrame, norm: str, radii: np.ndarray) -> np.ndarray:
    """The attack's bound on the certified accuracy at each radius (m,): the share of the
    evaluated rows that are correct and not broken within the radius (NaN for every radius
    if the norm was not attacked)."""
    radii = np.asarray(radii, dtype=float)
    instances = evaluated(instances)
    if not len(instances) or not attacked(instances, norm):
        return np.full(radii.shape, np.nan)
    upper = best_upper_bound(instances, norm).to_numpy()
    unbroken = np.where(np.isnan(upper), np.inf, upper)
    good = np.where(_correct(instances), unbroken, -np.inf)
    return (good[None, :] > radii[:, None]).mean(axis=1)


def accuracy_row(instances: pd.DataFrame, radii: Mapping[str, Sequence[float]]) -> dict:
    """The columns of :func:`accuracy_columns` for one model's rows."""
    row: dict[str, float] = {}
    for norm in NORMS:
        eps = np.asarray(radii.get(norm, ()), dtype=float)
        if not len(eps):
            continue
        cert, att = certified_share(instances, norm, eps), attack_share(instances, norm, eps)
        for e, c, a in zip(eps, cert, att, strict=True):
            row[f"certified_accuracy_{norm}_{radius_text(e)}"] = float(c)
            row[f"attack_accuracy_{norm}_{radius_text(e)}"] = float(a)
    return row


def curve_radii(instances: pd.DataFrame, norm: str, points: int = 200) -> np.ndarray:
    """Radii at which to draw certified-accuracy curves of ``instances`` in ``norm``: from 0
    to a little past the largest finite certificate or upper bound of a correct point."""
    correct = _correct(instances)
    values = np.concatenate(
        [
            best_guarantee(instances, norm).to_numpy()[correct],
            best_upper_bound(instances, norm).to_numpy()[correct],
        ]
    )
    finite = values[np.isfinite(values)]
    top = float(np.quantile(finite, 0.99)) * 1.1 if len(finite) else 1.0
    return np.linspace(0.0, top if top > 0 else 1.0, points)

"""The three p-norms of the paper: their names and their p.

Guarantees (Theorem 2.1, with the dual norm q, 1/p + 1/q = 1) and adversarial samples
(Section 4, problem opt:p-box) are computed for p = 1, 2 and inf. The configuration and the
results name them ``l1``, ``l2`` and ``linf`` (``attack.norms``, a training's ``adv_norm``,
the columns ``guarantee_l1``, ``upper_bound_linf``, ...); the maths takes the number p.
"""

from __future__ import annotations

import math

from .errors import ConfigError

#: Name of a norm in the configuration and the results -> its p.
NORMS: dict[str, float] = {"l1": 1.0, "l2": 2.0, "linf": math.inf}

#: The supported values of p, ascending.
P_VALUES: tuple[float, ...] = tuple(NORMS.values())


def norm_p(name: str) -> float:
    """The p of the norm called ``name`` (``l1``, ``l2`` or ``linf``); a
    :class:`~crosslip.errors.ConfigError` naming the allowed names for any other."""
    try:
        return NORMS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown norm {name!r}; allowed: {', '.join(NORMS)}") from None


def check_p(p: float) -> float:
    """``p`` as a float if it is 1, 2 or inf; ``ValueError`` for any other number."""
    p = float(p)
    if p not in P_VALUES:
        raise ValueError(f"p = {p}: only the 1-, 2- and inf-norms are supported")
    return p


def dual_exponent(p: float) -> float:
    """``q`` with ``1/p + 1/q = 1`` for p in {1, 2, inf} (the dual norm's: ``|a^T v| <=
    ||a||_q ||v||_p``)."""
    if p == 2:
        return 2.0
    if p == 1:
        return math.inf
    if math.isinf(p):
        return 1.0
    raise ValueError(f"p = {p}: only the 1-, 2- and inf-norms are supported")

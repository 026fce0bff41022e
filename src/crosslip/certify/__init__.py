"""Robustness guarantees (lower bounds): Theorem 2.1 and the bounds it needs.

* :mod:`.search`: Theorem 2.1 as one generic, batched search over R.
* :mod:`.softplus_bounds`: local bounds of the one-hidden-layer net (Proposition 2.3, interval
  bounds for any p, box-constrained ranges), the global bound, and their minimum.
* :mod:`.kernel_bounds`: Proposition 2.2 (Gaussian-kernel models) and their certification.
* :mod:`.engine`: every guarantee of a net for a batch of points (the pipeline's columns).
* :mod:`.dispatch`: :func:`certify`, the one entry point for any model: it picks the bounds
  by the model's kind.
* :mod:`.reference`: straightforward per-point implementations (test oracles, baselines).
* :mod:`.rounding`: the floating-point error model, its constants, the verified spectral
  norm and the float32 decision check (what a certificate covers: ``docs/guarantees.md``).
"""

from .dispatch import Certification, certify, certify_model
from .engine import KINDS, certify_softplus
from .kernel_bounds import KernelProp22Bound, certify_kernel
from .reference import linear_lipschitz
from .rounding import float32_agrees, spectral_norm_upper
from .search import Certificate, LipschitzFn, margins, margins_lower, min_ratio, theorem21
from .softplus_bounds import (
    IntervalBound,
    MinBound,
    NetTerms,
    PreactivationRange,
    Prop23Bound,
    dual_exponent,
    global_bound,
)

__all__ = [
    "KINDS",
    "Certificate",
    "Certification",
    "IntervalBound",
    "KernelProp22Bound",
    "LipschitzFn",
    "MinBound",
    "NetTerms",
    "PreactivationRange",
    "Prop23Bound",
    "certify",
    "certify_kernel",
    "certify_model",
    "certify_softplus",
    "dual_exponent",
    "float32_agrees",
    "global_bound",
    "linear_lipschitz",
    "margins",
    "margins_lower",
    "min_ratio",
    "spectral_norm_upper",
    "theorem21",
]

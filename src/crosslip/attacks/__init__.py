"""Adversarial samples and upper bounds (Section 4).

* :mod:`.projections`: exact, batched box-constrained minimal-norm steps onto a half-space
  for p = 1, 2, inf (Algorithm 1 and its L1/Linf counterparts), with a per-row reference.
* :mod:`.upper_bounds`: the paper's search for the decision boundary, minimum over targets,
  and a refinement by re-linearization; every sample is verified.
"""

from .projections import NORMS, BoxProblem, project_box, project_box_reference
from .upper_bounds import UpperBound, refine_upper_bound, upper_bound, upper_bound_l2

BoxL2Problem = BoxProblem  # p = 2 is the default of BoxProblem.build


def project_l2_box(x, v, c, lo: float = 0.0, hi: float = 1.0):
    """:func:`project_box` with p = 2 (Lemma 4.1)."""
    return project_box(x, v, c, 2, lo, hi)


__all__ = [
    "NORMS",
    "BoxL2Problem",
    "BoxProblem",
    "UpperBound",
    "project_box",
    "project_box_reference",
    "project_l2_box",
    "refine_upper_bound",
    "upper_bound",
    "upper_bound_l2",
]

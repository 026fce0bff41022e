"""Adversarial samples and upper bounds (Section 4).

* :mod:`.projections`: exact, batched box-constrained minimal-norm steps onto a half-space
  for p = 1, 2, inf (Algorithm 1 and its L1/Linf counterparts), sorted once for many
  right-hand sides per row, with a per-row reference.
* :mod:`.single_rhs`: the same optimum for one right-hand side per row without a full sort
  (:func:`project_box`).
* :mod:`.upper_bounds`: the paper's search for the decision boundary, minimum over targets,
  and a refinement by re-linearization; every sample is verified.
* :mod:`.min_norm`: an iterative minimal-norm L2 attack (FMN walks with targets, restarts
  and a warm start from the above), box-constrained and verified: the strongest upper bound.
* :mod:`.one_step`: the authors' adversarial-training samples, one step towards the
  runner-up class for a random fraction of the gap (fixed shapes, no host reads).
"""

from .min_norm import min_norm_attack
from .one_step import one_step, one_step_stacked
from .projections import BoxProblem, project_box_reference
from .single_rhs import project_box
from .upper_bounds import UpperBound, refine_upper_bound, upper_bound

__all__ = [
    "BoxProblem",
    "UpperBound",
    "min_norm_attack",
    "one_step",
    "one_step_stacked",
    "project_box",
    "project_box_reference",
    "refine_upper_bound",
    "upper_bound",
]

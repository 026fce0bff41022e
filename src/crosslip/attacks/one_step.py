r"""The authors' adversarial-training samples: one box-constrained step towards the
runner-up class (Section 5, "adversarial training ... with the code from Section 4").

The paper replaces half of each batch by box-constrained adversarial samples in the
infinity norm made "with the code from Section 4", and says no more. The authors' code
(``create_mixed_ae_batch``: ``generate_ae`` without the search over all classes and without
the binary search) makes each sample of a point ``x`` with predicted class ``c`` (no
dropout) in one step:

* the target is the runner-up class ``j``, the second largest logit at ``x``;
* the classifier is linearized at ``x``, ``v = grad f_c(x) - grad f_j(x)``, and the
  box-constrained problem of Section 4 (:mod:`.projections`)

      ``min ||delta||_p  s.t.  <v, delta> <= -t,  lo <= x + delta <= hi``

  is solved once, for the decrease ``t = r (f_c(x) - f_j(x))`` with ``r`` uniform in [0, 1)
  (the authors' ``c *= np.random.rand()``): the sample lies a random fraction of the way
  to the linearized decision boundary between c and j, so it need not change the class;
* a point whose problem the box does not allow (``t`` above the box's capacity) stays as it
  is (the authors' ``opt_failed``).

The norm is the paper's (Linf in Section 5; the authors' code used its L2 solver). Every
shape is fixed and nothing is read back to the host, so that a training step that makes
these samples can be recorded as one CUDA graph (:mod:`crosslip.training.grid`): the
fractions ``r`` come in as a tensor drawn outside the step.
"""

from __future__ import annotations

import torch

from ..models import StackedSoftplusNet
from .projections import BoxProblem


def runner_up(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The predicted class ``c``, the runner-up ``j`` (the two largest logits, ``c`` first)
    and the gap ``f_c - f_j >= 0`` of every row of ``logits`` (..., K): three tensors of
    shape (...); the gap keeps the logits' autograd graph."""
    top = logits.topk(2, dim=-1)
    return top.indices[..., 0], top.indices[..., 1], top.values[..., 0] - top.values[..., 1]


def box_step(
    x: torch.Tensor,
    v: torch.Tensor,
    t: torch.Tensor,
    p: float,
    lo: float = 0.0,
    hi: float = 1.0,
    check: bool = True,
) -> torch.Tensor:
    """``x + delta`` (r, d) for rows ``x, v`` (r, d) and decreases ``t`` (r,): the
    minimal-norm ``delta`` with ``<v, delta> <= -t`` inside the box (exact, the sorted
    solver :class:`BoxProblem`); ``x`` itself where ``t <= 0`` or where the box cannot
    decrease ``<v, .>`` by ``t``. ``check=False`` skips the host-side check that ``x`` lies
    in the box (the caller's promise), so that nothing is read back to the host."""
    prob = BoxProblem.build(x, v, p, lo, hi, check=check)
    delta, _, feasible = prob.solve(t)
    return torch.where(feasible[:, None], (x + delta).clamp(lo, hi), x)


def one_step(
    model: torch.nn.Module,
    x: torch.Tensor,
    fractions: torch.Tensor,
    p: float,
    lo: float = 0.0,
    hi: float = 1.0,
) -> torch.Tensor:
    """The one-step samples (module docstring) of the points ``x`` (m, d) for any model,
    with the fractions ``r`` (m,): (m, d) in ``x``'s dtype. The model is evaluated as it is
    (the caller puts it in eval mode); ``v`` by automatic differentiation, one backward
    pass."""
    with torch.enable_grad():
        xa = x.detach().requires_grad_(True)
        _, _, gap = runner_up(model(xa))
        (v,) = torch.autograd.grad(gap.sum(), xa)
    with torch.no_grad():
        return box_step(x, v, fractions.to(x.dtype) * gap.detach(), p, lo, hi)


@torch.no_grad()
def one_step_stacked(
    stack: StackedSoftplusNet,
    x: torch.Tensor,
    fractions: torch.Tensor,
    p: float,
    lo: float = 0.0,
    hi: float = 1.0,
) -> torch.Tensor:
    """The one-step samples of the points ``x`` (m, d) for every network of ``stack`` (no
    dropout), the same fractions ``r`` (m,) for all: (G, m, d). In closed form,
    ``v = U[g]^T (sigma'(z) * (W[g]_c - W[g]_j))`` (one batched product), and without any
    read back to the host (``x`` must lie in the box: it is not checked)."""
    logits, z = stack.logits_and_preactivation(x)  # (G, m, K), (G, m, H)
    size, m, h = z.shape
    c, j, gap = runner_up(logits)  # (G, m) each
    w = stack.W  # (G, K, H)
    w_c = w.gather(1, c[:, :, None].expand(size, m, h))
    w_j = w.gather(1, j[:, :, None].expand(size, m, h))
    v = torch.matmul(stack.sigma_prime(z) * (w_c - w_j), stack.U)  # (G, m, d)
    t = fractions.to(x.dtype) * gap
    d = x.shape[1]
    rows = x.expand(size, m, d).reshape(size * m, d)
    out = box_step(rows, v.reshape(size * m, d), t.reshape(-1), p, lo, hi, check=False)
    return out.view(size, m, d)

r"""Training for the certificate: the certified-margin regularizer.

Section 3's thesis is a regularizer that makes the guarantee grow. Cross-Lipschitz does it
through the gradients at the training points only. This regularizer trains on a
*lower bound of the margin over the whole L2 ball* of a target radius, the second-order
bound that crosslip's curvature certificate (:mod:`crosslip.certify.curvature`,
:mod:`crosslip.certify.trust_region`) is built on.

For the one-hidden-layer net, a training point ``x`` with label ``y``, a class ``j != y``,
``g = f_y - f_j = sum_l delta_l sigma(z_l) + const``, ``delta = w_y - w_j`` (H,) and
``||v||_2 <= r``:

    g(x + v) >= m_j - r ||grad g(x)||_2 - kappa_yj r^2 / 2 =: B_j(x, r),

    m_j = f_y(x) - f_j(x),   grad g(x) = U^T (delta * sigma'(z(x))),
    kappa_yj = lambda_max(U^T diag(alpha/4 (w_j - w_y)_+) U),

because the units with ``delta_l > 0`` are convex (they only add), and those with
``delta_l < 0`` curve down by at most ``|delta_l| max sigma'' = |delta_l| alpha / 4`` along
``u_l``. This is the largest-eigenvalue form of the curvature certificate with every unit's
curvature over its pre-activation range (the certificate's ``sup Q_l``) replaced by its
maximum over the whole line, ``alpha / 4``: so wherever ``B_j(x, r) > 0`` for every j (with
the exact ``lambda_max``), the curvature certificate of ``x`` is at least ``r`` up to rounding,
and the trust-region form, which minimises the same quadratic over the ball, at least as
large. The surrogate is *looser* than what judges the network, never tighter.

The penalty (eq. L-Alg's ``Omega``, weighted by lambda) is the robust cross-entropy of the
bounds, the loss of provable training (Wong & Kolter, ICML 2018; CROWN-IBP, Zhang et al.,
ICLR 2020) on these bounds:

    Omega = 1/n sum_i log(1 + sum_{j != y_i} exp(-B_j(x_i, r_t))),

which at ``r_t = 0`` is the cross-entropy itself (``B_j = m_j``). The radius grows linearly
from 0 to the target ``r`` over the first ``warmup`` fraction of the updates
(:func:`scheduled_radius`), as provable training ramps its epsilon.

What comes from where:

* the second-order bound ``m - r ||grad|| - kappa r^2 / 2`` with a curvature bound of the
  Hessian's concave part: Singla & Feizi, ICML 2020, "Second-Order Provable Defenses against
  Adversarial Attacks" (CRT), which trains two-layer sigmoid nets on it against the
  runner-up class; here against every class, with the softplus's ``alpha / 4``;
* the largest eigenvalue by power iteration warm-started across updates, one step per
  update: the per-class-pair form of the spectral-norm estimate of Lipschitz-margin training
  (Tsuzuku, Sato and Sugiyama, NeurIPS 2018) and GloRo (Leino, Wang and Fredrikson, ICML
  2021);
* the robust cross-entropy and the radius schedule: provable training (Wong & Kolter;
  Gowal et al., 2018; Zhang et al., 2020).

``kappa_yj`` enters as the Rayleigh quotient ``sum_l alpha/4 (w_j - w_y)_+,l (u_l^T v)^2``
of the current unit vector ``v`` of the pair (:class:`CurvatureVectors`); by Danskin's
theorem its gradient at the top eigenvector is the eigenvalue's. A vector that has not
converged *under*-estimates ``kappa``: the surrogate is then optimistic, which only trains
less well. It never judges: only the exact, rounding-covered certificate does.

Cost per update, n points, K classes, H units, d inputs: the gradients ``grad g`` of the
``n (K - 1)`` rows, one (n (K - 1), H) x (H, d) product and the two of its backward, as
Cross-Lipschitz's closed form (:mod:`.regularizers`); and three (K^2, H) x (H, d) products
for the Rayleigh quotients, their backward and the power step.

Shapes: every function takes an optional leading grid dimension G (a
:class:`~crosslip.models.StackedSoftplusNet`'s), ``U`` (G, H, d), ``W`` (G, K, H), ``z``
(G, n, H), and gives one value per grid point; without it, one network.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

#: Power-iteration steps on the curvature vectors before the first update (from random
#: unit vectors); each update then takes one more step from where the last one left off.
WARM_START_STEPS = 32


def scheduled_radius(
    updates: torch.Tensor, radius: float, warmup_updates: int, dtype: torch.dtype
) -> torch.Tensor:
    """The radius trained for after ``updates`` updates (a tensor of any shape), in
    ``dtype``: ``radius`` times ``min(1, updates / warmup_updates)`` (computed in float64, so
    that every trainer gets the same number), ``radius`` from the start if ``warmup_updates``
    is 0."""
    done = updates.to(torch.float64)
    if warmup_updates <= 0:
        return torch.full_like(done, radius).to(dtype)
    return ((done / warmup_updates).clamp(max=1.0) * radius).to(dtype)


def warmup_updates(warmup: float, total: int) -> int:
    """Updates over which the radius grows: ``round(warmup * total)``."""
    return round(warmup * total)


def other_classes(y: torch.Tensor, k: int) -> torch.Tensor:
    """The classes other than each label, (n, K - 1): ``(y + 1, ..., y + K - 1) mod K``."""
    return (y[:, None] + torch.arange(1, k, device=y.device)) % k


def concave_curvature(w: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha / 4 (w_j - w_c)_+`` for every class pair, (..., K, K, H) from ``W`` (..., K,
    H): entry ``[c, j]`` bounds the downward curvature of ``f_c - f_j`` along each unit
    (``sigma'' <= alpha / 4``)."""
    return (w[..., None, :, :] - w[..., :, None, :]).clamp_min(0.0) * (alpha / 4)


def project_units(u: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """``u_l^T v`` of every class pair's vector ``v`` (..., K, K, d): (..., K, K, H)."""
    *lead, k, _, d = vectors.shape
    return (vectors.reshape(*lead, k * k, d) @ u.mT).view(*lead, k, k, -1)


def rayleigh_quotients(
    u: torch.Tensor, w: torch.Tensor, alpha: float, vectors: torch.Tensor
) -> torch.Tensor:
    """``v^T U^T diag(kappa_cj) U v`` of every class pair (..., K, K) for the unit vectors
    ``vectors`` (..., K, K, d), differentiable in ``U`` and ``W``: at the top eigenvectors,
    the curvature constants ``kappa_cj`` of the module docstring, and below them anywhere
    else."""
    return (project_units(u, vectors).pow(2) * concave_curvature(w, alpha)).sum(-1)


class CurvatureVectors:
    """Unit vectors (..., K, K, d), one per class pair, that track the top eigenvector of
    ``U^T diag(kappa_cj) U`` (:func:`concave_curvature`) by power iteration across updates.

    Drawn from ``generator`` (the CPU's, so that a training on any device starts alike;
    every network of a grid the same draw, as each would draw alone), then
    :data:`WARM_START_STEPS` steps at the initial weights. :meth:`rayleigh` gives the
    quotients with gradients to ``U`` and ``W`` and advances the vectors by one step in
    place (no read back to the host: a CUDA graph can record it)."""

    def __init__(
        self,
        u: torch.Tensor,
        w: torch.Tensor,
        alpha: float,
        generator: torch.Generator,
        steps: int = WARM_START_STEPS,
    ) -> None:
        *lead, k, _ = w.shape
        d = u.shape[-1]
        draw = torch.randn(k, k, d, generator=generator, dtype=torch.float64)
        draw = F.normalize(draw, dim=-1).expand(*lead, k, k, d)
        self.alpha = alpha
        self.vectors = draw.to(dtype=u.dtype, device=u.device, copy=True).contiguous()
        with torch.no_grad():
            kappa = concave_curvature(w, alpha)
            for _ in range(steps):
                self._step(project_units(u, self.vectors), kappa, u)

    @torch.no_grad()
    def _step(self, t: torch.Tensor, kappa: torch.Tensor, u: torch.Tensor) -> None:
        """One power step from the projections ``t`` (:func:`project_units`); a pair whose
        matrix maps its vector to (nearly) zero keeps its vector (a zero matrix has no
        direction to find)."""
        lead = t.shape[:-3]
        k, h = t.shape[-2], t.shape[-1]
        nxt = ((t * kappa).reshape(*lead, k * k, h) @ u).view_as(self.vectors)
        norm = torch.linalg.vector_norm(nxt, dim=-1, keepdim=True)
        tiny = torch.finfo(nxt.dtype).tiny ** 0.5
        self.vectors.copy_(torch.where(norm > tiny, nxt / norm.clamp_min(tiny), self.vectors))

    def rayleigh(self, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """:func:`rayleigh_quotients` at the current vectors (..., K, K), then one power step
        (in place, outside the graph)."""
        kappa = concave_curvature(w, self.alpha)
        t = project_units(u, self.vectors.clone())  # the graph keeps this step's vectors
        out = (t.pow(2) * kappa).sum(-1)
        self._step(t.detach(), kappa.detach(), u.detach())
        return out


def margin_lower_bounds(
    z: torch.Tensor,
    logits: torch.Tensor,
    y: torch.Tensor,
    u: torch.Tensor,
    w: torch.Tensor,
    alpha: float,
    radius: torch.Tensor | float,
    curvature: torch.Tensor,
) -> torch.Tensor:
    """``B_j(x_i, r)`` of the module docstring for every point and class ``j != y_i``,
    (..., n, K - 1) in the order of :func:`other_classes`.

    ``z`` (..., n, H) and ``logits`` (..., n, K): the forward pass at the points; ``y`` (n,)
    the labels; ``u`` (..., H, d), ``w`` (..., K, H); ``radius``: a number or (...,);
    ``curvature`` (..., K, K): ``kappa`` of every class pair (:meth:`CurvatureVectors.
    rayleigh`, or exact eigenvalues in a test)."""
    k = w.shape[-2]
    n = y.shape[0]
    others = other_classes(y, k).expand(*z.shape[:-2], n, k - 1)  # (..., n, K-1)
    s = torch.sigmoid(alpha * z)  # (..., n, H)
    # every class's input gradient, one (n K, H) x (H, d) product: grad f_j = U^T (w_j * s)
    rows = (s[..., :, None, :] * w[..., None, :, :]).flatten(-3, -2)
    grads = (rows @ u).unflatten(-2, (n, k))  # (..., n, K, d)
    label = y.expand(*z.shape[:-2], n)[..., None]  # (..., n, 1)
    own = grads.gather(-2, label[..., None].expand(*label.shape, grads.shape[-1]))
    grad_sq = (own - grads).pow(2).sum(-1).gather(-1, others)  # (..., n, K-1)
    grad_norm = grad_sq.clamp_min(torch.finfo(grad_sq.dtype).tiny).sqrt()
    margin = logits.gather(-1, label) - logits.gather(-1, others)
    kappa = curvature[..., y, :].gather(-1, others)  # (..., n, K-1)
    r = torch.as_tensor(radius, dtype=z.dtype, device=z.device)
    r = r[..., None, None] if r.dim() else r
    return margin - r * grad_norm - 0.5 * kappa * r * r


def robust_cross_entropy(bounds: torch.Tensor) -> torch.Tensor:
    """``mean_i log(1 + sum_j exp(-B_j(x_i)))`` over the points, (...,), from the bounds
    (..., n, K - 1): the cross-entropy of logits ``(0, -B_1, ..., -B_{K-1})`` with the label
    first."""
    zero = bounds.new_zeros(*bounds.shape[:-1], 1)
    return torch.logsumexp(torch.cat([zero, -bounds], dim=-1), dim=-1).mean(-1)


class CertifiedMargin:
    """The regularizer in one training of one network or a grid of them: the radius
    schedule (``radius``, reached after ``warmup_updates``) and the curvature vectors
    (:class:`CurvatureVectors`, from the initial weights ``u``, ``w``)."""

    def __init__(
        self,
        u: torch.Tensor,
        w: torch.Tensor,
        alpha: float,
        radius: float,
        warmup_updates: int,
        generator: torch.Generator,
    ) -> None:
        self.alpha, self.radius, self.warmup_updates = alpha, radius, warmup_updates
        self.vectors = CurvatureVectors(u.detach(), w.detach(), alpha, generator)

    def penalty(
        self,
        z: torch.Tensor,
        logits: torch.Tensor,
        y: torch.Tensor,
        u: torch.Tensor,
        w: torch.Tensor,
        updates: torch.Tensor,
    ) -> torch.Tensor:
        """Omega at the radius of ``updates`` updates done ((...,) or a scalar tensor),
        one value per network; advances the curvature vectors by one power step."""
        r = scheduled_radius(updates, self.radius, self.warmup_updates, z.dtype)
        curvature = self.vectors.rayleigh(u, w)
        return robust_cross_entropy(
            margin_lower_bounds(z, logits, y, u, w, self.alpha, r, curvature)
        )

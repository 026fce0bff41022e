"""Gaussian-kernel classifiers of Section 2.2 and the kernel width of Section 5.

The model of Section 2.2 ("Evaluation of the Bound for Kernel Methods") is a kernel expansion
``f_j(x) = sum_r alpha_jr k(x_r, x)``, ``j = 1..K``, over ``n`` expansion points ``x_r`` (the
training points), here with the Gaussian kernel ``k(x, y) = exp(-gamma ||x - y||_2^2)``.
Its input gradients have the closed form used throughout Section 2.2:
``grad_y k(x_r, y) = -2 gamma (y - x_r) k(x_r, y)``.

Section 5 ("Kernel methods") sets ``gamma = a / rho_KNN40^2`` where ``rho_KNN40`` is the mean
of the 40-nearest-neighbour distances on the training set (:func:`gamma_from_data`).
Shapes: centers ``(n, d)``, coefficients ``(K, n)``, inputs ``(m, d)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..device import host_tensor


class GaussianKernelModel(nn.Module):
    """``f_j(x) = sum_r coef[j, r] exp(-gamma ||x - x_r||_2^2)`` (Section 2.2, Gaussian kernel).

    ``centers`` (n, d) is a buffer (the expansion points ``x_r``), ``coef`` (K, n) a parameter
    (the paper's ``alpha``), initialised to zeros. ``hyper`` holds the JSON-serialisable
    constructor arguments other than the centers, so that a model can be saved as weights only
    (state dict + ``hyper``) and rebuilt as ``GaussianKernelModel(torch.zeros(n_centers,
    in_dim), num_classes, gamma)`` followed by ``load_state_dict``. ``copy=False`` keeps
    ``centers`` itself (a floating-point tensor the caller does not use otherwise) instead of
    a copy: one (n, d) array less while the model is built.
    """

    def __init__(
        self, centers: torch.Tensor, num_classes: int, gamma: float, *, copy: bool = True
    ) -> None:
        super().__init__()
        centers = host_tensor(centers)
        if centers.ndim != 2 or centers.shape[0] < 1:
            raise ValueError(f"centers must have shape (n, d) with n >= 1, got {centers.shape}")
        if not centers.is_floating_point():
            centers = centers.to(torch.get_default_dtype())
        if not gamma > 0:
            raise ValueError(f"gamma must be positive, got {gamma}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        n, d = centers.shape
        self.register_buffer("centers", centers.detach().clone() if copy else centers.detach())
        self.coef = nn.Parameter(
            torch.zeros(num_classes, n, dtype=centers.dtype, device=centers.device)
        )
        self.gamma = float(gamma)
        self.hyper = dict(
            in_dim=int(d), num_classes=int(num_classes), n_centers=int(n), gamma=float(gamma)
        )

    def sq_distances(self, x: torch.Tensor) -> torch.Tensor:
        """``||x_i - x_r||_2^2``, shape (m, n), via norms and one matmul, clamped at 0."""
        c = self.centers
        sq = (x * x).sum(1)[:, None] + (c * c).sum(1)[None, :] - 2.0 * (x @ c.T)
        return sq.clamp_min(0.0)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """``k(x_r, x_i) = exp(-gamma ||x_i - x_r||^2)``, shape (m, n), for ``x`` (m, d)."""
        return torch.exp(-self.gamma * self.sq_distances(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``f(x)``, shape (m, K), for ``x`` of shape (m, d)."""
        return self.kernel(x) @ self.coef.T

    def class_gradients(self, x: torch.Tensor) -> torch.Tensor:
        """Input gradients ``grad f_j(x)``, shape (m, K, d), in closed form.

        ``grad f_j(x) = -2 gamma sum_r coef[j, r] k(x_r, x) (x - x_r)
        = -2 gamma (f_j(x) x - sum_r coef[j, r] k(x_r, x) x_r)``: one (m, K, n) weight tensor
        and one matmul with the centers; no (m, n, d) tensor. Differentiable (autograd
        through it gives second derivatives).
        """
        w = self.kernel(x)[:, None, :] * self.coef[None, :, :]  # (m, K, n)
        f = w.sum(-1)  # (m, K)
        return -2.0 * self.gamma * (f[:, :, None] * x[:, None, :] - w @ self.centers)


def kernel_rows(
    x: torch.Tensor,
    centers: torch.Tensor,
    gamma: float,
    out: torch.Tensor | None = None,
    centers_sq: torch.Tensor | None = None,
) -> torch.Tensor:
    """``exp(-gamma ||x_i - c_r||^2)``, shape (m, N), for ``x`` (m, d) and ``centers`` (N, d),
    computed in place in one (m, N) buffer (``out``, or a new one): one matmul, then
    ``-2 <x_i, c_r> + ||x_i||^2 + ||c_r||^2`` clamped at 0, times ``-gamma``, exponentiated.
    ``centers_sq`` (N,): ``||c_r||^2`` if already known. Not differentiable (use
    :meth:`GaussianKernelModel.kernel` for autograd); same values as it up to rounding."""
    if centers_sq is None:
        centers_sq = (centers * centers).sum(1)
    out = torch.mm(x, centers.T, out=out)
    out.mul_(-2.0).add_((x * x).sum(1)[:, None]).add_(centers_sq[None, :])
    return out.clamp_min_(0.0).mul_(-gamma).exp_()


def knn_mean_distance(x_train: torch.Tensor, neighbours: int = 40, chunk: int = 1024) -> float:
    """Mean of the distances of every training point to its ``neighbours`` nearest other
    training points (the point itself excluded by index, so duplicates count as neighbours
    at distance 0): the mean over all ``n * neighbours`` distances.

    ``x_train`` (n, d), a tensor (its device is used) or an array (on the CPU). Computed in
    float64 in chunks of ``chunk`` rows, as :func:`kernel_rows` computes kernel values: one
    (chunk, d) x (d, n) product into a (chunk, n) buffer gives the squared distances
    ``|x_i|^2 + |x_j|^2 - 2 <x_i, x_j>`` (clamped at 0), the point itself is set to
    infinity, and the square roots of the ``neighbours`` smallest per row are summed. Memory:
    the buffer, the ``n`` squared norms and :func:`torch.topk`'s working memory; no (n, d)
    temporary (:mod:`crosslip.kernel_memory` counts ``3 chunk n`` elements for this phase).
    """
    x = host_tensor(x_train).to(torch.float64)
    n = x.shape[0]
    if not 1 <= neighbours <= n - 1:
        raise ValueError(f"need 1 <= neighbours <= n - 1 = {n - 1}, got {neighbours}")
    chunk = max(1, min(chunk, n))
    sq = torch.empty(n, dtype=x.dtype, device=x.device)
    for i in range(0, n, chunk):
        sq[i : i + chunk] = (x[i : i + chunk] * x[i : i + chunk]).sum(1)
    buf = torch.empty(chunk, n, dtype=x.dtype, device=x.device)
    total = 0.0
    for i in range(0, n, chunk):
        rows = x[i : i + chunk]
        b = len(rows)
        dist = torch.mm(rows, x.T, out=buf[:b]).mul_(-2.0)
        dist.add_(sq[i : i + b, None]).add_(sq[None, :]).clamp_min_(0.0)
        dist[:, i : i + b].diagonal().fill_(torch.inf)  # the point itself
        nearest = dist.topk(neighbours, dim=1, largest=False).values
        total += nearest.sqrt_().sum().item()
    return total / (n * neighbours)


def gamma_from_data(
    x_train: torch.Tensor, a: float = 1.0, neighbours: int = 40, chunk: int = 1024
) -> float:
    """Kernel width of Section 5: ``gamma = a / rho^2``, ``rho`` = :func:`knn_mean_distance`.

    The paper: "``gamma = alpha / rho_KNN40^2`` and ``rho_KNN40`` is the mean of the 40 nearest
    neighbor distances on the training set", with ``alpha`` (here ``a``) in {0.5, 1, 2, 4}.
    We read "mean of the 40 nearest neighbor distances" as the mean over every training point
    and each of its 40 nearest neighbours (not the mean 40th-neighbour distance).
    """
    rho = knn_mean_distance(x_train, neighbours=neighbours, chunk=chunk)
    if not rho > 0:
        raise ValueError("the mean nearest-neighbour distance is 0 (duplicate points only?)")
    return float(a) / rho**2

"""Regularization functionals of Section 3.

Cross-Lipschitz regularization, Eq. (eq:crosslip):
``Omega(f) = 1/(n K^2) sum_i sum_{l,m} ||grad f_l(x_i) - grad f_m(x_i)||_2^2``.
With ``g_l = grad f_l(x_i)`` and ``gbar = mean_l g_l`` one has
``sum_{l,m} ||g_l - g_m||^2 = 2K sum_l ||g_l||^2 - 2 ||sum_l g_l||^2 = 2K sum_l ||g_l - gbar||^2``.

Note on the paper: the vectorized formula of Section 3.2 reads
``2/(nK^2) sum_{r,s} (sum_l w_lr w_ls - sum_l w_lr sum_m w_ms) ...``; expanding
``sum_{l,m} (w_lr - w_mr)(w_ls - w_ms) = 2K sum_l w_lr w_ls - 2 sum_l w_lr sum_m w_ms`` shows
that the first term needs a factor K. We implement the definition (eq:crosslip) exactly,
and the tests check the closed form against automatic differentiation of the definition.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..models import SoftplusNet


def cross_lipschitz_from_gradients(grads: torch.Tensor) -> torch.Tensor:
    """Omega from input gradients of shape (n, K, d) (mean over the n points)."""
    n, k, _ = grads.shape
    centered = grads - grads.mean(dim=1, keepdim=True)
    return 2.0 * k * centered.pow(2).sum() / (n * k * k)


def cross_lipschitz_autograd(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Omega by double backpropagation: exact for any differentiable ``model``.

    One backward pass per class with ``create_graph=True``, so Omega can be differentiated
    with respect to the parameters (used for models without a closed form).
    """
    x = x.detach().requires_grad_(True)
    out = model(x)
    grads = [
        torch.autograd.grad(out[:, k].sum(), x, create_graph=True)[0] for k in range(out.shape[1])
    ]
    return cross_lipschitz_from_gradients(torch.stack(grads, dim=1))


@functools.cache
def helmert(
    k: int, dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """Helmert contrasts, shape (K-1, K): row ``j`` (1-based) is ``(1, ..., 1, -j, 0, ...)``
    (j ones) over ``sqrt(j (j+1))``; orthonormal rows, each orthogonal to the ones vector.
    Cached per (K, dtype, device); do not modify the returned tensor."""
    q = torch.zeros(max(k - 1, 0), k, dtype=torch.float64, device="cpu")
    for j in range(1, k):
        q[j - 1, :j] = 1.0
        q[j - 1, j] = -float(j)
        q[j - 1] /= (j * (j + 1)) ** 0.5
    return q.to(dtype=dtype, device=device)


def cross_lipschitz_flops(n: int, d: int, k: int, h: int) -> dict[str, int]:
    """Flops (2 x multiply-adds) of the dominant matrix products of one exact Cross-Lipschitz
    value *and* its gradient (forward + backward), for ``n`` points of dimension ``d``, ``k``
    classes and ``h`` hidden units, per closed form of :func:`cross_lipschitz_softplus`:

    * ``gradients``: ``Y = A U`` with ``A`` of shape (n (K-1), H), then ``dA = Y U^T`` and
      ``dU = A^T Y``: three products of ``2 n (K-1) H d`` flops;
    * ``gram``: ``U U^T`` and ``S = sum_i s_i s_i^T`` forward, ``dU = 2 (C * S) U`` and
      ``ds = 2 s (G * C)`` backward: ``4 H^2 d + 4 n H^2``.
    """
    return {
        "gradients": 6 * n * max(k - 1, 0) * h * d,
        "gram": 4 * h * h * d + 4 * n * h * h,
    }


class _ContrastGradientNorm(torch.autograd.Function):
    """``sum_i sum_k ||U^T (q_k * s_i)||^2`` for ``s`` (n, H), ``q`` (K-1, H), ``U`` (H, d),
    as one (n (K-1), H) x (H, d) product ``Y = A U`` with ``A_(i,k) = q_k * s_i``; with a
    leading grid dimension (``s`` (G, n, H), ``q`` (G, K-1, H), ``U`` (G, H, d)) one value
    per grid point, shape (G,), from batched products of the same sizes.

    The backward is written out so that it costs exactly the two further products of the
    same size (``dA = 2 Y U^T``, ``dU = 2 A^T Y``) plus two elementwise reductions
    (``ds_i = sum_k q_k * dA_(i,k)``, ``dq_k = sum_i s_i * dA_(i,k)``); automatic
    differentiation of the same expression also materializes the broadcast products and
    the squares, which cost about as much as a fourth product at batch 64."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        *lead, n, h = s.shape
        # a product takes the layout of its inputs: s from a batched forward is a transposed
        # view (crosslip.models.stacked), whose (n, K-1, H) product would be copied whole
        # by the reshape; s is (K-1) times smaller
        s = s.contiguous()
        a = (s[..., :, None, :] * q[..., None, :, :]).reshape(*lead, n * q.shape[-2], h)
        y = a @ u  # (..., n (K-1), d): the centred input gradients
        ctx.save_for_backward(s, q, u, a, y)
        return y.pow(2).sum((-2, -1))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        s, q, u, a, y = ctx.saved_tensors
        *lead, n, h = s.shape
        scale = 2.0 * grad[..., None, None]
        ds = dq = du = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            da = (y @ u.mT).view(*lead, n, q.shape[-2], h)
            if ctx.needs_input_grad[0]:
                ds = (da * q[..., None, :, :]).sum(-2).mul_(scale)
            if ctx.needs_input_grad[1]:
                dq = (da * s[..., :, None, :]).sum(-3).mul_(scale)
        if ctx.needs_input_grad[2]:
            du = (a.mT @ y).mul_(scale)
        return ds, dq, du


class _GramNorm(torch.autograd.Function):
    """The same value as :class:`_ContrastGradientNorm` by expanding the square:
    ``sum_rt G_rt C_rt S_rt`` with ``G = U U^T``, ``C = q^T q``, ``S = s^T s`` (all (H, H),
    per grid point with a leading grid dimension).

    All three factors are symmetric, so each gradient is one product (``dU = 2 (C * S) U``,
    ``ds = 2 s (G * C)``, ``dq = 2 q (G * S)``) where automatic differentiation of a
    product ``X X^T`` computes two."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        g, c, sg = u @ u.mT, q.mT @ q, s.mT @ s
        ctx.save_for_backward(s, q, u, g, c, sg)
        return (g * c).mul_(sg).sum((-2, -1))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        s, q, u, g, c, sg = ctx.saved_tensors
        scale = 2.0 * grad[..., None, None]
        ds = dq = du = None
        if ctx.needs_input_grad[0]:
            ds = (s @ (g * c)).mul_(scale)
        if ctx.needs_input_grad[1]:
            dq = (q @ (g * sg)).mul_(scale)
        if ctx.needs_input_grad[2]:
            du = ((c * sg) @ u).mul_(scale)
        return ds, dq, du


def cross_lipschitz_closed_form(
    s: torch.Tensor, w: torch.Tensor, u: torch.Tensor, method: str = "auto"
) -> torch.Tensor:
    """Omega of one-hidden-layer nets from ``s = sigma'(z)`` (n, H), the output weights ``w``
    (K, H) and the hidden weights ``u`` (H, d): a scalar; or for G nets at once, ``s``
    (G, n, H), ``w`` (G, K, H), ``u`` (G, H, d): shape (G,), each value exactly the one net's
    (see :func:`cross_lipschitz_softplus` for the two methods and ``auto``)."""
    n, d = s.shape[-2], u.shape[-1]
    k, h = w.shape[-2:]
    if method == "auto":
        flops = cross_lipschitz_flops(n, d, k, h)
        method = min(flops, key=flops.__getitem__)
    if method not in ("gradients", "gram"):
        raise ValueError(f"method {method!r}: use 'auto', 'gradients' or 'gram'")
    q = helmert(k, w.dtype, w.device) @ w  # (..., K-1, H)
    norm = _GramNorm if method == "gram" else _ContrastGradientNorm
    return 2.0 * norm.apply(s, q, u) / (n * k)


def cross_lipschitz_softplus(
    net: SoftplusNet,
    x: torch.Tensor,
    method: str = "auto",
    preactivation: torch.Tensor | None = None,
) -> torch.Tensor:
    """Closed form of Omega for the one-hidden-layer net (Section 3.2), two exact ways.

    ``grad f_l(x) - gbar = U^T ((w_l - wbar) * sigma'(z))``; with the class-centred output
    weights ``Wc = W - mean_l w_l`` (K, H) and ``s_i = sigma'(U x_i + b)`` (n, H):

    * ``"gradients"``: ``Omega = 2/(n K) sum_i sum_l ||U^T (Wc_l * s_i)||^2``, one
      (n K, H) x (H, d) product;
    * ``"gram"``: expanding the square, ``Omega = 2/(n K) sum_rs G_rs C_rs S_rs`` with
      ``G = U U^T``, ``C = Wc^T Wc`` and ``S = sum_i s_i s_i^T`` (all (H, H)) (the paper's
      vectorized form, with its missing factor K restored);
    * ``"auto"`` picks the one with fewer flops for value and gradient
      (:func:`cross_lipschitz_flops`): ``gram`` once ``n K`` is well above ``H``.

    Both use ``K - 1`` rows instead of the K rows of ``Wc``: with the Helmert contrasts
    ``Q`` ((K-1, K), orthonormal rows orthogonal to the ones vector) ``Q^T Q = I - 11^T/K``,
    so ``Wc^T Wc = (QW)^T (QW)`` and ``sum_l ||U^T (Wc_l * s)||^2 = sum_k ||U^T ((QW)_k * s)||^2``
    exactly: a tenth fewer flops for K = 10. Both have hand-written backward passes
    (:class:`_ContrastGradientNorm`, :class:`_GramNorm`) and serve a grid of networks too
    (:func:`cross_lipschitz_closed_form`).

    ``preactivation``: ``z = U x + b`` of shape (n, H) if the caller already has it (from
    :meth:`SoftplusNet.logits_and_preactivation`), which saves recomputing it and its
    backward in a training step.
    """
    n = x.shape[0]
    h = net.W.shape[1]
    if method not in ("auto", "gradients", "gram"):
        raise ValueError(f"method {method!r}: use 'auto', 'gradients' or 'gram'")
    z = net.preactivation(x) if preactivation is None else preactivation
    if z.shape != (n, h):
        raise ValueError(f"preactivation has shape {tuple(z.shape)}; expected ({n}, {h})")
    return cross_lipschitz_closed_form(net.sigma_prime(z), net.W, net.U, method)


def weight_decay(model: nn.Module) -> torch.Tensor:
    """Half the squared Euclidean norm of the weights of the linear and convolutional layers,
    ``1/2 sum ||W||_F^2`` (biases and batch-norm scales excluded), as the authors'
    ``tf.nn.l2_loss`` over their "weights" variables; lambda multiplies it."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    return half_squared_norm([m.weight for m in layers])


def half_squared_norm(weights: Sequence[torch.Tensor], leading: int = 0) -> torch.Tensor:
    """``1/2 sum_W ||W||_F^2`` over ``weights``, per entry of their first ``leading``
    dimensions: a scalar for one network (``leading=0``, :func:`weight_decay`), (G,) for the
    weights ``U`` (G, H, d) and ``W`` (G, K, H) of a stack of G networks (``leading=1``)."""
    total: torch.Tensor | int = 0
    for w in weights:
        squares = w.pow(2)
        total = total + (
            squares.sum() if leading == 0 else squares.sum(tuple(range(leading, w.dim())))
        )
    return 0.5 * total

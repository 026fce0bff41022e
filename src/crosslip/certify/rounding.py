r"""Rounding: what the floating-point evaluation of a bound may be off by, and how it is covered.

A certificate is a statement about the *real-number* function computed by the model's weights
as float64 numbers (float32 weights are cast exactly), at the float64 point ``x``, in exact
real arithmetic. crosslip evaluates everything in float64, so each reported radius must also
absorb the rounding of that evaluation. The model of arithmetic (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2002, Sections 2.1 and 3.1) and its constants:

* ``u = 2^-53`` (:data:`UNIT`): every ``+ - * /`` and ``sqrt`` returns
  ``(a op b)(1 + delta)`` with ``|delta| <= u``, plus, for ``*`` and ``/`` only, an absolute
  error below ``2^-1074`` when the result is subnormal (gradual underflow: a sum or
  difference whose result is subnormal is exact).
* ``gamma_n = n u / (1 - n u)`` (:func:`gamma`): a dot product or sum of ``n`` terms,
  *in any order of summation and with or without fused multiply-adds*, has absolute error
  at most ``gamma_n sum_i |a_i b_i|`` (Higham, eq. 3.4; so does every entry of a matrix
  product, blocked or not, as long as it is an ordinary sum of products).
* Elementary functions (``exp``, ``log1p``, ``sigmoid``, ``logaddexp`` as PyTorch computes
  them): relative error at most :data:`FN_REL` ``= 2^-44`` (512 u) where the real result
  is at least ``2^-1000``, absolute error at most ``2^-1020`` where it is below. This is an
  *assumption* about the library; the libraries document 1 to 4 ulp (2 to 8 u), and
  ``tests/test_rounding.py`` measures < 3 u, and ``2^-1024`` absolute (``sigmoid`` returns 0
  once ``exp(-t)`` overflows), against 250-bit arithmetic on extreme and random arguments.

From this, each bound gets a documented error term (derived in the docstrings of
:mod:`.softplus_bounds`, :mod:`.kernel_bounds` and :mod:`.search`):

1. *Margins.* Each logit comes with a bound ``e_j`` on its forward error, and theorem 2.1
   uses ``m_j - (e_c + e_j) - 2u |m_j|`` (:func:`.search.margins_lower`), a lower bound on
   the real margin ``f_c(x) - f_j(x)``.
2. *Bounds ``L_j(R)``.* Inputs of a bound formula (ranges of ``sigma'``, shifts) are rounded
   *outward* so that the formula, evaluated exactly, is still a valid bound; the formula's
   own rounding is bounded by ``c n u`` times a computed magnitude (a sum of absolute values
   of the terms that cancel), added before the square root; and an absolute term covers
   underflow (:meth:`.softplus_bounds.NetTerms.underflow_floor`).
3. *Ratios* ``m / L`` are rounded down (:func:`.search.ratios`).

Two non-relative facts are decided from the weights, never from an evaluation: a class whose
gradient difference is zero everywhere (tied output weights, or only zero rows of ``U``
where they differ), and the spectral norm ``||U||_2``, verified by a Cholesky factorization
(:func:`spectral_norm_upper`).

:func:`float32_agrees` tells where the float32 version of a model (weights and input cast to
float32) predicts another class than the float64 evaluation: a certificate says nothing
about the float32 network there (``docs/guarantees.md``).
"""

from __future__ import annotations

import copy
import math

import torch

from ..device import tf32

#: Unit roundoff of float64.
UNIT = 2.0**-53
#: Assumed relative accuracy of PyTorch's float64 elementary functions (module docstring).
FN_REL = 2.0**-44
#: Values of ``sigma'`` below this are replaced by it (upper ends) or by 0 (lower ends), so
#: that the library's absolute error on tiny results never needs tracking.
SIGMA_FLOOR = 2.0**-990
#: A normal float64 number that dominates every sum of at most ``2^20`` absolute errors of
#: the elementary functions on tiny results (``2^-1020``) and of at most ``2^60`` underflows
#: of products (``2^-1074``): a generous absolute term.
UNDERFLOW = 2.0**-1000

DTYPE = torch.float64


def gamma(n: int | float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)`` for float64 (``n u < 1``)."""
    nu = n * UNIT
    if nu >= 0.5:
        raise ValueError(f"gamma_n with n = {n} is not small; the error analysis does not apply")
    return nu / (1.0 - nu)


def require_float64(dtype: torch.dtype) -> None:
    """One-line error for a certification dtype other than float64 (the error analysis and
    its constants are float64's)."""
    if dtype != DTYPE:
        raise ValueError(
            f"certification computes in float64 only (got dtype={dtype}); its rounding "
            "error bounds are derived for float64: leave dtype at its default"
        )


def spectral_norm_upper(U: torch.Tensor) -> torch.Tensor:
    r"""A rigorous upper bound on ``||U||_2`` (0-d float64 tensor on ``U``'s device,
    computed on the CPU) for the float64 matrix ``U`` (H, d), valid in real arithmetic.

    ``s`` = the computed largest singular value (LAPACK, not itself a bound). With
    ``A = U`` or ``U^T`` so that ``G = A^T A`` is the smaller Gram matrix (n0 x n0) and ``k``
    the other dimension, choose ``t`` a little above ``s^2`` and let floating-point Cholesky
    factor ``B = fl(t I - fl(G))``. If it runs to completion with factor ``R``, then
    ``R^T R = B + dB``, ``|dB| <= gamma_{n0+1} |R^T| |R|`` (Higham, Thm 10.3, for any
    order of the inner products, hence for LAPACK's blocked ``potrf``), so
    ``lambda_min(B) >= -gamma_{n0+1} ||R||_F^2``. Moreover ``||fl(G) - G||_2 <=
    gamma_k || |A|^T |A| ||_2 <= gamma_k ||U||_F^2`` and the diagonal subtraction rounds by
    at most ``u (t + max G_ii)``. Hence ``lambda_max(G) <= t + gamma_{n0+1} ||R||_F^2 +
    u (t + max G_ii) + gamma_k ||U||_F^2`` (each term doubled below for the rounding of its
    own evaluation) and ``||U||_2`` is at most its square root. If Cholesky fails for every
    ``t`` tried, the Frobenius norm (always an upper bound) is returned; ``inf`` where ``U``
    has a NaN or an infinite entry.
    """
    A = U.detach().to(device="cpu", dtype=DTYPE)
    if not torch.isfinite(A).all():  # no bound: a global certificate of 0
        return torch.tensor(math.inf, dtype=DTYPE, device=U.device)
    if not torch.any(A != 0):
        return torch.zeros((), dtype=DTYPE, device=U.device)
    if A.shape[0] < A.shape[1]:
        A = A.T
    k, n0 = A.shape
    fro2 = float((A * A).sum()) * (1 + 2 * gamma(k * n0 + 1)) + UNDERFLOW
    G = A.T @ A
    G = 0.5 * (G + G.T)  # exactly symmetric; each entry still within gamma_{k+2} of A^T A
    s = float(torch.linalg.matrix_norm(A, ord=2))
    t = s * s * (1 + 2.0**-30) + UNDERFLOW
    diag_max = float(G.diagonal().max())
    for step in (2.0**-20, 2.0**-10, 2.0**-4, 1.0):
        B = -G
        B.diagonal().add_(t)
        R, info = torch.linalg.cholesky_ex(B)
        if int(info) == 0 and bool(torch.isfinite(R).all()):
            rf2 = float((R * R).sum())
            err = (gamma(n0 + 1) * rf2 + UNIT * (t + diag_max) + gamma(k + 2) * fro2) * 2
            bound = math.sqrt(t + err + UNDERFLOW) * (1 + 4 * UNIT)
            return torch.tensor(bound, dtype=DTYPE, device=U.device)
        t = t * (1 + step)
    return torch.tensor(math.sqrt(fro2) * (1 + 4 * UNIT), dtype=DTYPE, device=U.device)


@torch.no_grad()
def float32_agrees(model: torch.nn.Module, x: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """Whether the float32 model (a copy with weights and input cast to float32, evaluated on
    ``x``'s device in IEEE float32, :func:`crosslip.device.tf32` off) predicts ``pred`` (n,) at the
    points ``x`` (n, d): (n,) bool on the CPU.

    A certificate covers the float64 evaluation of the weights in real arithmetic; where the
    float32 decision differs already at ``x`` it says nothing about the deployed float32
    network, and the pipeline reports the guarantee there as 0. TF32 is off for this
    evaluation so that the column means the same on every device (on a GPU, cuDNN would
    otherwise convolve a ResNet's float32 input with 10-bit mantissas)."""
    m32 = copy.deepcopy(model).to(device=x.device, dtype=torch.float32).eval()
    with tf32(False):
        pred32 = m32(x.to(torch.float32)).argmax(1)
    return pred32.cpu() == pred.cpu()

"""Gaussian-kernel classifiers trained as in Sections 3.1 and 5: Kernel-LogReg and Kernel-CL.

Both minimize the convex objective (eq. L-Alg)

    (1/n) sum_i CE(y_i, f(x_i)) + lambda * Omega(alpha),    f_j(x) = sum_r alpha_jr k(x_r, x),

over the coefficients ``alpha`` (K, N) by L-BFGS, with ``k(x, y) = exp(-gamma ||x - y||^2)``,
``gamma = a / rho^2`` (``rho``: mean 40-nearest-neighbour distance on the training set,
:func:`crosslip.kernels.gamma_from_data`) and expansion points ``x_r``: all training points,
or a fixed-seed subset of ``N`` of them (``n_centers``) so that it fits a laptop.

* Kernel-LogReg: ``Omega = sum_j ||f_j||_H^2 = sum_j alpha_j^T K_cc alpha_j`` (RKHS norm).
* Kernel-CL (eq. crosslip): ``Omega = 1/(n K^2) sum_i sum_{l,m} ||grad f_l(x_i) -
  grad f_m(x_i)||^2``. With ``grad f_l(x_i) = sum_r alpha_lr g_r(x_i)``,
  ``g_r(x_i) = grad_y k(x_r, x_i) = -2 gamma (x_i - x_r) k_ir``, this is
  ``1/(n K^2) sum_{l,m} (alpha_l - alpha_m)^T M (alpha_l - alpha_m)`` with the (N, N) Gram
  matrix ``M_rs = sum_i <g_r(x_i), g_s(x_i)> = 4 gamma^2 sum_i k_ir k_is <x_i - x_r, x_i - x_s>``
  (the paper's ``k'``), and ``sum_{l,m} (a_l - a_m)^T M (a_l - a_m) = 2K sum_l a_l^T M a_l
  - 2 s^T M s`` with ``s = sum_l a_l``. ``M`` is computed once, from four (N, n) x (n, N)
  products (:func:`cross_lipschitz_gram`), so each L-BFGS step costs one (n, N) x (N, K)
  product. Both penalties are convex quadratics (``K_cc``, ``M`` positive semi-definite).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .config import KernelTrainSpec
from .families import KERNEL_REGULARIZERS  # noqa: F401 (re-exported)
from .kernels import GaussianKernelModel, gamma_from_data
from .progress import Progress
from .train import TrainResult, error_rate

LOG = logging.getLogger(__name__)

#: Hyperparameters of one kernel training job: the workflow's typed spec.
KernelTrainConfig = KernelTrainSpec


def cross_lipschitz_gram(model: GaussianKernelModel, x: torch.Tensor) -> torch.Tensor:
    """``M_rs = 4 gamma^2 sum_i k_ir k_is <x_i - x_r, x_i - x_s>``, shape (N, N), for the
    points ``x`` (n, d). Expanding the inner product,
    ``M / (4 gamma^2) = Kt^T diag(|x|^2) Kt - (Kt*B)^T Kt - Kt^T (Kt*B) + (C C^T) * (Kt^T Kt)``
    with ``Kt = k(x_i, x_r)`` (n, N), ``B = x C^T`` (n, N) and ``C`` the centres (N, d)."""
    kt = model.kernel(x)
    c = model.centers
    kb = kt * (x @ c.T)
    m = kt.T @ ((x * x).sum(1)[:, None] * kt) - kb.T @ kt - kt.T @ kb + (c @ c.T) * (kt.T @ kt)
    m = 4 * model.gamma**2 * m
    return 0.5 * (m + m.T)


def cross_lipschitz_kernel(coef: torch.Tensor, gram: torch.Tensor, n: int) -> torch.Tensor:
    """Eq. crosslip for a kernel model from its Gram matrix (:func:`cross_lipschitz_gram`
    over the ``n`` training points): ``(2 / (n K)) [sum_l a_l^T M a_l - s^T M s / K]``."""
    k = coef.shape[0]
    s = coef.sum(0)
    return 2 / (n * k) * (((coef @ gram) * coef).sum() - s @ gram @ s / k)


def rkhs_norm(coef: torch.Tensor, kcc: torch.Tensor) -> torch.Tensor:
    """``sum_j ||f_j||_H^2 = sum_j alpha_j^T K_cc alpha_j``."""
    return ((coef @ kcc) * coef).sum()


def train_kernel(
    cfg: KernelTrainConfig,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
    device: torch.device | str = "cpu",
) -> TrainResult:
    """Fit a :class:`GaussianKernelModel` by L-BFGS (float64); metrics as in
    :func:`crosslip.train.train` (``curve``: objective per evaluation, several per L-BFGS
    iteration when the line search needs them; ``setup_seconds``: bandwidth, kernel and Gram
    matrices; ``lbfgs_iterations`` and ``seconds_per_lbfgs_iteration``). Progress goes to
    the ``"crosslip"`` logger (:mod:`crosslip.progress`): the set-up, then at every tenth of
    ``max_iter`` L-BFGS iterations the objective at the iteration's first evaluation, its
    penalty and training error, and the evaluations so far."""
    device = torch.device(device)
    dt = torch.float64
    xtr = torch.as_tensor(x_train, device=device, dtype=dt)
    ytr = torch.as_tensor(y_train, device=device)
    n = len(xtr)
    gen = torch.Generator().manual_seed(cfg.seed)
    n_centers = n if cfg.n_centers in (0, None) or cfg.n_centers >= n else cfg.n_centers
    pick = torch.randperm(n, generator=gen)[:n_centers].sort().values.to(device)
    t0 = time.perf_counter()
    gamma = gamma_from_data(xtr, a=cfg.a, neighbours=min(cfg.neighbours, n - 1))
    model = GaussianKernelModel(xtr[pick], num_classes, gamma).to(device)
    kt = model.kernel(xtr)  # (n, N), fixed during training
    if cfg.regularizer == "kernel_logreg":
        kcc = model.kernel(model.centers)

        def penalty(coef: torch.Tensor) -> torch.Tensor:
            return rkhs_norm(coef, kcc)
    else:
        gram = cross_lipschitz_gram(model, xtr)

        def penalty(coef: torch.Tensor) -> torch.Tensor:
            return cross_lipschitz_kernel(coef, gram, n)

    coef = model.coef
    setup_seconds = time.perf_counter() - t0
    LOG.info(
        "train: %d centres, gamma %.4g, %s matrices ready in %.1f s; L-BFGS, at most %d iterations",
        n_centers,
        gamma,
        cfg.regularizer,
        setup_seconds,
        cfg.max_iter,
    )
    progress = Progress("train", cfg.max_iter, "L-BFGS iterations")
    opt = torch.optim.LBFGS(
        [coef],
        lr=1.0,
        max_iter=cfg.max_iter,
        tolerance_grad=cfg.tol,
        tolerance_change=1e-15,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    curve: list[dict[str, float]] = []

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        logits = kt @ coef.T
        ce = F.cross_entropy(logits, ytr)
        pen = penalty(coef)
        loss = ce + cfg.lam * pen
        loss.backward()
        curve.append({"evaluation": len(curve) + 1, "loss": loss.item(), "penalty": pen.item()})
        iteration = int(opt.state[coef].get("n_iter", 0))  # L-BFGS's count, 0 at the start
        if progress.active and iteration > progress.done:
            with torch.no_grad():
                err = float((logits.argmax(1) != ytr).double().mean())
            progress.update(
                iteration - progress.done,
                loss=curve[-1]["loss"],
                penalty=curve[-1]["penalty"],
                train_error=err,
                evaluations=len(curve),
            )
        return loss

    opt.step(closure)
    progress.close(loss=curve[-1]["loss"], evaluations=len(curve))
    status = "ok" if all(math.isfinite(c["loss"]) for c in curve) else "diverged"
    with torch.no_grad():
        grad_norm = float(coef.grad.norm()) if coef.grad is not None else float("nan")
    seconds = time.perf_counter() - t0
    iterations = int(opt.state[coef].get("n_iter", 0))
    LOG.info("train: L-BFGS stopped after %d iterations (at most %d), %d evaluations: objective "
             "%.6g, gradient norm %.3g, %.1f s", iterations, cfg.max_iter, len(curve),
             curve[-1]["loss"] if curve else float("nan"), grad_norm, seconds)  # fmt: skip
    model = model.cpu().eval()
    xte, yte = torch.as_tensor(x_test, dtype=dt), torch.as_tensor(y_test)
    metrics: dict[str, Any] = {
        "status": status,
        "test_error": error_rate(model, xte, yte) if status == "ok" else None,
        "train_error": error_rate(model, xtr.cpu(), ytr.cpu()) if status == "ok" else None,
        "curve": curve,
        "gradient_norm": grad_norm,
        "gamma": gamma,
        "n_centers": n_centers,
        "seconds": seconds,
        "setup_seconds": setup_seconds,
        "lbfgs_iterations": iterations,
        "seconds_per_lbfgs_iteration": (seconds - setup_seconds) / max(iterations, 1),
        "device": str(device),
        "n_train": int(n),
        "n_test": len(x_test),
        "config": {**asdict(cfg), "lr": None},
    }
    return TrainResult(model, metrics)

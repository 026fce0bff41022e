"""Gaussian-kernel classifiers trained as in Sections 3.1 and 5: Kernel-LogReg and Kernel-CL.

Both minimize the convex objective (eq. L-Alg)

    (1/n) sum_i CE(y_i, f(x_i)) + lambda * Omega(alpha),    f_j(x) = sum_r alpha_jr k(x_r, x),

over the coefficients ``alpha`` (K, N) by L-BFGS, with ``k(x, y) = exp(-gamma ||x - y||^2)``,
``gamma = a / rho^2`` (``rho``: mean 40-nearest-neighbour distance on the training set,
:func:`crosslip.models.kernels.gamma_from_data`) and expansion points ``x_r``: all training points,
or a fixed-seed subset of ``N`` of them (``n_centers``) so that it fits a laptop.

* Kernel-LogReg: ``Omega = sum_j ||f_j||_H^2 = sum_j alpha_j^T K_cc alpha_j`` (RKHS norm).
* Kernel-CL (eq. crosslip): ``Omega = 1/(n K^2) sum_i sum_{l,m} ||grad f_l(x_i) -
  grad f_m(x_i)||^2``. With ``grad f_l(x_i) = sum_r alpha_lr g_r(x_i)``,
  ``g_r(x_i) = grad_y k(x_r, x_i) = -2 gamma (x_i - x_r) k_ir``, this is
  ``1/(n K^2) sum_{l,m} (alpha_l - alpha_m)^T M (alpha_l - alpha_m)`` with the (N, N) Gram
  matrix ``M_rs = sum_i <g_r(x_i), g_s(x_i)> = 4 gamma^2 sum_i k_ir k_is <x_i - x_r, x_i - x_s>``
  (the paper's ``k'``), and ``sum_{l,m} (a_l - a_m)^T M (a_l - a_m) = 2K sum_l a_l^T M a_l
  - 2 s^T M s`` with ``s = sum_l a_l``. ``M`` is computed once (:func:`cross_lipschitz_gram`
  densely, :func:`cross_lipschitz_gram_chunked` within a memory budget), so each L-BFGS step
  costs one (n, N) x (N, K) product. Both penalties are convex quadratics (``K_cc``, ``M``
  positive semi-definite).

At scale (all 60,000 MNIST training points as centres) nothing of size (n, N) beyond the
budget ``memory_gb`` is held: :func:`crosslip.kernel_memory.train_plan` chooses the chunks.
``M`` is accumulated over chunks of training points, its ``(C C^T) * (Kt^T Kt)`` term in an
accumulator of a block of centre rows per pass; ``K_cc`` is built in row blocks; L-BFGS keeps
``Kt`` if it fits and otherwise recomputes it chunk by chunk at every evaluation
(cross-entropy and its gradient are sums over training points, accumulated per chunk).
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

from ..config.schema import default as config_default
from ..config.specs import KernelTrainSpec
from ..data.dataset import Dataset
from ..device import host_tensor
from ..families import KERNEL_REGULARIZERS  # noqa: F401 (re-exported)
from ..kernel_memory import TrainPlan, budget_bytes, centers_used, train_plan
from ..models.kernels import GaussianKernelModel, gamma_from_data, kernel_rows
from ..progress import Progress
from .core import TrainResult

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


def cross_lipschitz_gram_chunked(
    x: torch.Tensor, centers: torch.Tensor, gamma: float, rows: int, block: int
) -> torch.Tensor:
    """The Gram matrix of :func:`cross_lipschitz_gram`, shape (N, N), for the points ``x``
    (n, d) and ``centers`` (N, d), holding no (n, N) array: per chunk of ``rows`` training
    points, one product ``B_i = x_i C^T`` gives ``Kt_i = exp(-gamma (|x_i|^2 + |c|^2 -
    2 B_i))`` and ``W_i = Kt_i * (|x_i|^2 - 2 B_i)`` (two (rows, N) buffers), and for the
    centre rows ``I`` of the current block ``M[I] += Kt_i[:, I]^T W_i`` and
    ``A_I += Kt_i[:, I]^T Kt_i``. After each pass over the training set the accumulator
    ``A_I`` (``block`` x N) gets ``M[I] += (C_I C^T) * A_I``. ``Kt^T W`` is ``M / (4 gamma^2)``
    up to an antisymmetric part, so ``M = 4 gamma^2 (S + S^T) / 2`` with ``S`` the sum,
    symmetrized in place block by block. Passes: ``ceil(N / block)``."""
    n, N = x.shape[0], centers.shape[0]
    rows, block = max(1, min(rows, n)), max(1, min(block, N))
    opts = dict(dtype=centers.dtype, device=centers.device)
    m = torch.zeros(N, N, **opts)
    c_sq = (centers * centers).sum(1)
    kbuf, bbuf = torch.empty(rows, N, **opts), torch.empty(rows, N, **opts)
    for b0 in range(0, N, block):
        b1 = min(N, b0 + block)
        acc = torch.zeros(b1 - b0, N, **opts)
        for i0 in range(0, n, rows):
            xi = x[i0 : i0 + rows]
            ci = xi.shape[0]
            x_sq = (xi * xi).sum(1)[:, None]
            bmat = torch.mm(xi, centers.T, out=bbuf[:ci])  # <x_i, c_s>
            kt = torch.mul(bmat, -2.0, out=kbuf[:ci]).add_(x_sq).add_(c_sq[None, :])
            kt.clamp_min_(0.0).mul_(-gamma).exp_()  # k(x_i, c_s)
            w = bmat.mul_(-2.0).add_(x_sq).mul_(kt)  # k_is (|x_i|^2 - 2 <x_i, c_s>)
            k_block = kt[:, b0:b1]
            m[b0:b1].addmm_(k_block.T, w)
            acc.addmm_(k_block.T, kt)
        for s0 in range(b0, b1, rows):  # A_I *= C_I C^T, ``rows`` rows at a time
            s1 = min(b1, s0 + rows)
            acc[s0 - b0 : s1 - b0].mul_(torch.mm(centers[s0:s1], centers.T, out=kbuf[: s1 - s0]))
        m[b0:b1].add_(acc)
        del acc  # before the next pass allocates its own
    m.mul_(4 * gamma**2)
    symmetrize_(m, min(rows, N), scratch=bbuf)  # tiles of at most rows x N elements
    return m


def symmetrize_(m: torch.Tensor, block: int, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``m <- (m + m^T) / 2`` in place, in (block, block) tiles: no (N, N) temporary. Each
    tile's average goes to ``scratch`` (contiguous, at least ``block^2`` elements) where
    given, else to one (block, block) temporary."""
    N = m.shape[0]
    flat = None if scratch is None else scratch.view(-1)
    for i0 in range(0, N, block):
        for j0 in range(i0, N, block):
            upper, lower = m[i0 : i0 + block, j0 : j0 + block], m[j0 : j0 + block, i0 : i0 + block]
            out = None if flat is None else flat[: upper.numel()].view(upper.shape)
            avg = torch.add(upper, lower.T, out=out).mul_(0.5)
            upper.copy_(avg)
            lower.copy_(avg.T)
    return m


def kernel_matrix_chunked(centers: torch.Tensor, gamma: float, rows: int) -> torch.Tensor:
    """``K_cc = k(c_r, c_s)``, shape (N, N), computed ``rows`` rows at a time in place."""
    N = centers.shape[0]
    out = torch.empty(N, N, dtype=centers.dtype, device=centers.device)
    c_sq = (centers * centers).sum(1)
    for i0 in range(0, N, max(1, rows)):
        block = out[i0 : i0 + max(1, rows)]
        kernel_rows(centers[i0 : i0 + max(1, rows)], centers, gamma, out=block, centers_sq=c_sq)
    return out


def cross_lipschitz_kernel(coef: torch.Tensor, gram: torch.Tensor, n: int) -> torch.Tensor:
    """Eq. crosslip for a kernel model from its Gram matrix (:func:`cross_lipschitz_gram`
    over the ``n`` training points): ``(2 / (n K)) [sum_l a_l^T M a_l - s^T M s / K]``."""
    k = coef.shape[0]
    s = coef.sum(0)
    return 2 / (n * k) * (((coef @ gram) * coef).sum() - s @ gram @ s / k)


def rkhs_norm(coef: torch.Tensor, kcc: torch.Tensor) -> torch.Tensor:
    """``sum_j ||f_j||_H^2 = sum_j alpha_j^T K_cc alpha_j``."""
    return ((coef @ kcc) * coef).sum()


def plan_for(
    cfg: KernelTrainConfig,
    n: int,
    dim: int,
    num_classes: int,
    memory_gb: float | None = None,
    device: torch.device | str = "cpu",
) -> TrainPlan:
    """The chunk plan of a training job on ``device``
    (:func:`crosslip.kernel_memory.train_plan`) within ``memory_gb`` GiB (default: the
    schema's ``kernel.memory_gb``)."""
    memory_gb = config_default("kernel.memory_gb") if memory_gb is None else memory_gb
    N = centers_used(cfg.n_centers, n)
    kind = torch.device(device).type
    return train_plan(n, N, dim, num_classes, cfg.regularizer, budget_bytes(memory_gb), kind)


def _errors(
    model: GaussianKernelModel,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    rows: int,
) -> float:
    """Fraction of misclassified points, ``rows`` kernel rows at a time on the model's
    device (float64)."""
    c, dev = model.centers, model.centers.device
    c_sq, buf = (c * c).sum(1), None
    wrong = 0
    with torch.no_grad():
        for i in range(0, len(x), rows):
            xb = host_tensor(x[i : i + rows]).to(device=dev, dtype=c.dtype)
            yb = host_tensor(y[i : i + rows]).to(dev)
            if buf is None:
                buf = torch.empty(min(rows, len(x)), c.shape[0], dtype=c.dtype, device=dev)
            kt = kernel_rows(xb, c, model.gamma, out=buf[: len(xb)], centers_sq=c_sq)
            wrong += int(((kt @ model.coef.T).argmax(1) != yb).sum())
    return wrong / max(len(x), 1)


def train_kernel(
    cfg: KernelTrainConfig,
    data: Dataset,
    device: torch.device | str = "cpu",
    memory_gb: float | None = None,
    gamma: float | None = None,
) -> TrainResult:
    """Fit a :class:`GaussianKernelModel` by L-BFGS (float64) to ``data`` (read from it:
    ``x_train`` (n, d), ``y_train`` (n,), ``x_test``, ``y_test`` and ``num_classes``; not
    ``shape``) on ``device`` within
    ``memory_gb`` GiB of it (default: the schema's ``kernel.memory_gb``; see
    :func:`plan_for`); metrics as in :func:`crosslip.training.single.train` (``curve``: objective
    per evaluation, several per L-BFGS iteration when the line search needs them; ``setup_seconds``:
    bandwidth, kernel and Gram matrices, of which ``bandwidth_seconds`` and
    ``penalty_matrix_seconds`` the first two; ``lbfgs_iterations`` and
    ``seconds_per_lbfgs_iteration``; the same in CPU time of the process, ``cpu_seconds``,
    ``setup_cpu_seconds``, ``cpu_seconds_per_lbfgs_iteration``: meaningful on a shared machine) and
    the plan (``chunk_rows``, ``gram_block_rows``, ``gram_passes``, ``kernel_matrix_kept``,
    ``memory_budget_gib``, ``memory_peak_gib``, ``memory_device_reserve_gib``; on CUDA
    ``cuda_peak_gib``, the allocator's peak above what the process held when the job began:
    graph pools and workspaces left by earlier work in the same process are not its own). Raises
    :class:`crosslip.kernel_memory.KernelMemoryError` if the model cannot fit the budget.
    ``gamma``: the kernel width if already known (benchmarks), instead of ``a / rho^2``
    (whose nearest-neighbour pass costs ``2 n^2 d`` flops)."""
    device = torch.device(device)
    dt = torch.float64
    n, dim = len(data.x_train), int(np.prod(np.shape(data.x_train)[1:]))
    plan = plan_for(cfg, n, dim, data.num_classes, memory_gb, device)
    if device.type == "cuda":
        torch.cuda.init()  # with an index (cuda:0), resetting the stats needs CUDA set up
        torch.cuda.reset_peak_memory_stats(device)
        held_before = torch.cuda.memory_allocated(device)  # by others in this process
    xtr = host_tensor(data.x_train).to(device=device, dtype=dt)
    ytr = host_tensor(data.y_train).to(device)
    gen = torch.Generator("cpu").manual_seed(cfg.seed)  # drawn on the CPU: the same anywhere
    n_centers = plan.n_centers
    pick = torch.randperm(n, generator=gen, device="cpu")[:n_centers].sort().values.to(device)
    t0, c0 = time.perf_counter(), time.process_time()
    if gamma is None:
        gamma = gamma_from_data(
            xtr, a=cfg.a, neighbours=min(cfg.neighbours, n - 1), chunk=plan.knn_rows
        )
    bandwidth_seconds = time.perf_counter() - t0
    model = GaussianKernelModel(xtr[pick], data.num_classes, gamma, copy=False)
    centers = model.centers
    # The (N, N) penalty matrix and Kt (n, N), fixed during training (Kt kept whole if it
    # fits, else recomputed per chunk); dropped after training.
    held: dict[str, torch.Tensor] = {}
    if cfg.regularizer == "kernel_logreg":
        held["matrix"] = kernel_matrix_chunked(centers, gamma, plan.rows)

        def penalty(coef: torch.Tensor) -> torch.Tensor:
            return rkhs_norm(coef, held["matrix"])
    else:
        held["matrix"] = cross_lipschitz_gram_chunked(xtr, centers, gamma, plan.rows, plan.block)

        def penalty(coef: torch.Tensor) -> torch.Tensor:
            return cross_lipschitz_kernel(coef, held["matrix"], n)

    matrix_seconds = time.perf_counter() - t0 - bandwidth_seconds
    c_sq = (centers * centers).sum(1)
    if plan.keep_kernel:  # built in chunks: no (n, d) temporary beside it
        held["kt"] = torch.empty(n, n_centers, dtype=dt, device=device)
        for i0 in range(0, n, plan.rows):
            out = held["kt"][i0 : i0 + plan.rows]
            kernel_rows(xtr[i0 : i0 + plan.rows], centers, gamma, out=out, centers_sq=c_sq)
    else:
        held["buffer"] = torch.empty(plan.rows, n_centers, dtype=dt, device=device)
    step = n if plan.keep_kernel else plan.rows
    coef = model.coef
    setup_seconds, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
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
        ce = torch.zeros((), dtype=dt, device=device)
        wrong = torch.zeros((), dtype=torch.int64, device=device)
        for i0 in range(0, n, step):  # (1/n) sum_i CE: one backward pass per chunk
            if plan.keep_kernel:
                k_i = held["kt"][i0 : i0 + step]
            else:
                with torch.no_grad():
                    xi, buf = xtr[i0 : i0 + step], held["buffer"]
                    k_i = kernel_rows(xi, centers, gamma, out=buf[: len(xi)], centers_sq=c_sq)
            logits = k_i @ coef.T
            part = F.cross_entropy(logits, ytr[i0 : i0 + step], reduction="sum") / n
            part.backward()
            ce += part.detach()
            wrong += (logits.detach().argmax(1) != ytr[i0 : i0 + step]).sum()
        pen = penalty(coef)
        (cfg.lam * pen).backward()
        loss = ce + cfg.lam * pen.detach()
        curve.append({"evaluation": len(curve) + 1, "loss": loss.item(), "penalty": pen.item()})
        iteration = int(opt.state[coef].get("n_iter", 0))  # L-BFGS's count, 0 at the start
        if progress.active and iteration > progress.done:
            progress.update(
                iteration - progress.done,
                loss=curve[-1]["loss"],
                penalty=curve[-1]["penalty"],
                train_error=float(wrong) / n,
                evaluations=len(curve),
            )
        return loss

    opt.step(closure)
    progress.close(loss=curve[-1]["loss"], evaluations=len(curve))
    status = "ok" if all(math.isfinite(c["loss"]) for c in curve) else "diverged"
    with torch.no_grad():
        grad_norm = float(coef.grad.norm()) if coef.grad is not None else float("nan")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    iterations = int(opt.state[coef].get("n_iter", 0))
    LOG.info(
        "train: L-BFGS stopped after %d iterations (at most %d), %d evaluations: objective "
        "%.6g, gradient norm %.3g, %.1f s",
        iterations,
        cfg.max_iter,
        len(curve),
        curve[-1]["loss"] if curve else float("nan"),
        grad_norm,
        seconds,
    )
    held.clear()
    opt.state.clear()
    model.eval()
    ok = status == "ok"
    test_error = _errors(model, data.x_test, data.y_test, plan.rows) if ok else None
    train_error = _errors(model, xtr, ytr, plan.rows) if ok else None
    metrics: dict[str, Any] = {
        "status": status,
        "test_error": test_error,
        "train_error": train_error,
        "curve": curve,
        "gradient_norm": grad_norm,
        "gamma": gamma,
        "n_centers": n_centers,
        "seconds": seconds,
        "setup_seconds": setup_seconds,
        "bandwidth_seconds": bandwidth_seconds,
        "penalty_matrix_seconds": matrix_seconds,
        "lbfgs_iterations": iterations,
        "seconds_per_lbfgs_iteration": (seconds - setup_seconds) / max(iterations, 1),
        "cpu_seconds": cpu,
        "setup_cpu_seconds": setup_cpu,
        "cpu_seconds_per_lbfgs_iteration": (cpu - setup_cpu) / max(iterations, 1),
        "device": str(device),
        "n_train": int(n),
        "n_test": len(data.x_test),
        **plan.describe(),
        "config": {**asdict(cfg), "lr": None},
    }
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - held_before
        metrics["cuda_peak_gib"] = peak / 2**30
    return TrainResult(model.cpu(), metrics)

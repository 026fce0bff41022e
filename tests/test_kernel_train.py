"""Kernel-LogReg and Kernel-CL (Sections 3.1, 5): closed forms, convexity, L-BFGS optimum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crosslip.data import load_dataset
from crosslip.device import check_device_memory
from crosslip.errors import ConfigError
from crosslip.kernel_memory import KernelMemoryError, train_minimum_bytes, train_plan
from crosslip.models import class_gradients
from crosslip.models.kernels import GaussianKernelModel, gamma_from_data
from crosslip.training.kernel import (
    KernelTrainConfig,
    cross_lipschitz_gram,
    cross_lipschitz_gram_chunked,
    cross_lipschitz_kernel,
    kernel_matrix_chunked,
    plan_for,
    rkhs_norm,
    train_kernel,
)

from .helpers import toy_dataset


def small_model(n=15, d=4, k=3, seed=0, gamma=0.7):
    gen = torch.Generator().manual_seed(seed)
    model = GaussianKernelModel(torch.rand(n, d, generator=gen, dtype=torch.float64), k, gamma)
    with torch.no_grad():
        model.coef.copy_(torch.randn(k, n, generator=gen, dtype=torch.float64))
    x = torch.rand(25, d, generator=gen, dtype=torch.float64)
    return model, x


def cross_lipschitz_definition(model, x):
    """Eq. crosslip literally: 1/(nK^2) sum_i sum_{l,m} ||grad f_l(x_i) - grad f_m(x_i)||^2,
    with the gradients from automatic differentiation of the forward pass."""
    xr = x.clone().requires_grad_(True)
    out = model(xr)
    grads = torch.stack(
        [
            torch.autograd.grad(out[:, j].sum(), xr, create_graph=True)[0]
            for j in range(out.shape[1])
        ],
        1,
    )
    diff = grads[:, :, None, :] - grads[:, None, :, :]
    return (diff**2).sum() / (len(x) * out.shape[1] ** 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cross_lipschitz_closed_form_equals_the_definition_and_its_gradient(seed):
    model, x = small_model(seed=seed)
    closed = cross_lipschitz_kernel(model.coef, cross_lipschitz_gram(model, x), len(x))
    exact = cross_lipschitz_definition(model, x)
    assert torch.allclose(closed, exact, rtol=1e-10)
    (g1,) = torch.autograd.grad(closed, model.coef)
    (g2,) = torch.autograd.grad(exact, model.coef)
    assert torch.allclose(g1, g2, rtol=1e-8, atol=1e-12)
    # the gradients of the model agree with autograd too
    xr = x.clone().requires_grad_(True)
    auto = torch.autograd.grad(model(xr)[:, 1].sum(), xr)[0]
    assert torch.allclose(class_gradients(model, x)[:, 1], auto, rtol=1e-10)


def test_rkhs_norm_is_the_norm_of_the_expansion():
    model, _ = small_model()
    kcc = model.kernel(model.centers)
    expect = sum(model.coef[j] @ kcc @ model.coef[j] for j in range(3))
    assert torch.allclose(rkhs_norm(model.coef, kcc), expect)


@pytest.mark.parametrize("seed", [0, 1])
def test_penalties_and_objective_are_convex_along_random_directions(seed):
    model, x = small_model(seed=seed)
    gram, kcc = cross_lipschitz_gram(model, x), model.kernel(model.centers)
    y = torch.randint(0, 3, (len(x),), generator=torch.Generator().manual_seed(seed))
    kt = model.kernel(x)
    gen = torch.Generator().manual_seed(seed + 10)
    for _ in range(20):
        a = torch.randn(3, 15, generator=gen, dtype=torch.float64)
        b = torch.randn(3, 15, generator=gen, dtype=torch.float64)
        for f in (
            lambda c: cross_lipschitz_kernel(c, gram, len(x)),
            lambda c: rkhs_norm(c, kcc),
            lambda c: (
                torch.nn.functional.cross_entropy(kt @ c.T, y)
                + 0.1 * cross_lipschitz_kernel(c, gram, len(x))
            ),
        ):
            for t in (0.1, 0.5, 0.9):
                assert f(t * a + (1 - t) * b) <= t * f(a) + (1 - t) * f(b) + 1e-12
    assert torch.linalg.eigvalsh(gram).min() >= -1e-9 * torch.linalg.eigvalsh(gram).max()


@pytest.mark.parametrize("reg", ["kernel_logreg", "kernel_cl"])
def test_lbfgs_reaches_the_optimum_of_a_small_problem(reg):
    gen = np.random.default_rng(0)
    x = gen.random((60, 5)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 1).astype(np.int64) + (x[:, 2] > 0.5)
    cfg = KernelTrainConfig(
        regularizer=reg, lam=1e-2, n_centers=0, neighbours=10, max_iter=500, tol=1e-9
    )
    res = train_kernel(cfg, toy_dataset(x, y, 3))
    assert res.metrics["status"] == "ok"
    assert res.metrics["gradient_norm"] < 1e-6
    assert res.metrics["n_centers"] == 60
    m = res.metrics
    # each L-BFGS iteration takes at least one objective evaluation (more in line searches)
    assert 1 <= m["lbfgs_iterations"] <= min(len(m["curve"]), cfg.max_iter)
    assert 0 < m["setup_seconds"] < m["seconds"]
    per_iter = (m["seconds"] - m["setup_seconds"]) / m["lbfgs_iterations"]
    assert m["seconds_per_lbfgs_iteration"] == pytest.approx(per_iter)


def test_short_kernel_training_on_embedded_data_reaches_a_sensible_error():
    ds = load_dataset("mnist5k")
    cfg = KernelTrainConfig(regularizer="kernel_cl", lam=1e-1, n_centers=500, max_iter=100)
    res = train_kernel(cfg, ds)
    assert res.metrics["status"] == "ok"
    assert res.metrics["test_error"] < 0.10  # ~6% measured: 500 centres, 100 L-BFGS steps
    again = train_kernel(cfg, ds)
    assert torch.equal(again.model.coef, res.model.coef)  # fixed seed: identical
    assert res.metrics["config"]["lr"] is None


def test_unknown_kernel_regularizer_is_rejected():
    with pytest.raises(ValueError, match="kernel_logreg"):
        KernelTrainConfig(regularizer="svm")


# ---------------------------------------------------------------------------------------------
# Chunked computation within a memory budget (all 60,000 MNIST points as centres)


def dense_lbfgs(cfg, x, y, num_classes):
    """The dense algorithm, literally: the (n, N) kernel matrix, the Gram matrix from four
    full products (cross_lipschitz_gram) or K_cc whole, one L-BFGS run on the full objective.
    Returns the coefficients and the objective per evaluation."""
    xtr, ytr = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y)
    n = len(xtr)
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))
    pick = pick[: cfg.n_centers or n].sort().values
    gamma = gamma_from_data(xtr, a=cfg.a, neighbours=min(cfg.neighbours, n - 1))
    model = GaussianKernelModel(xtr[pick], num_classes, gamma)
    kt = model.kernel(xtr)
    if cfg.regularizer == "kernel_logreg":
        mat = model.kernel(model.centers)
        pen = lambda c: rkhs_norm(c, mat)  # noqa: E731
    else:
        mat = cross_lipschitz_gram(model, xtr)
        pen = lambda c: cross_lipschitz_kernel(c, mat, n)  # noqa: E731
    coef = model.coef
    opt = torch.optim.LBFGS(
        [coef],
        lr=1.0,
        max_iter=cfg.max_iter,
        tolerance_grad=cfg.tol,
        tolerance_change=1e-15,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    losses = []

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(kt @ coef.T, ytr) + cfg.lam * pen(coef)
        loss.backward()
        losses.append(loss.item())
        return loss

    opt.step(closure)
    return coef.detach(), losses, gamma


def toy_data(n=70, d=6, seed=0):
    gen = np.random.default_rng(seed)
    x = gen.random((n, d)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 1).astype(np.int64) + (x[:, 2] > 0.5)
    return x, y


@pytest.mark.parametrize(("rows", "block"), [(1, 1), (5, 7), (8, 3), (13, 40), (37, 23), (99, 99)])
def test_chunked_gram_equals_the_dense_products(rows, block):
    model, x = small_model(n=23, d=5, seed=3)
    x = torch.cat([x, x[:12] + 0.01])  # 37 points
    dense = cross_lipschitz_gram(model, x)
    chunked = cross_lipschitz_gram_chunked(x, model.centers, model.gamma, rows, block)
    assert torch.equal(chunked, chunked.T)
    err = (chunked - dense).abs().max() / dense.abs().max()
    assert err < 1e-12, err
    kcc = kernel_matrix_chunked(model.centers, model.gamma, rows)
    torch.testing.assert_close(kcc, model.kernel(model.centers), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("reg", ["kernel_logreg", "kernel_cl"])
def test_chunked_training_equals_the_dense_algorithm(reg):
    """A budget a few KiB above the irreducible part forces chunks of a few rows, several
    passes for the Gram matrix and a kernel matrix recomputed at every evaluation; the
    coefficients after 25 L-BFGS iterations equal those of the dense algorithm."""
    x, y = toy_data()
    cfg = KernelTrainConfig(
        regularizer=reg, lam=1e-2, n_centers=40, neighbours=10, max_iter=25, tol=1e-12
    )
    coef, losses, gamma = dense_lbfgs(cfg, x, y, 3)
    need = train_minimum_bytes(70, 40, 6, 3, reg)
    tiny = (need + 3 * 8 * 40) / 2**30  # room for ~3 kernel rows beyond the minimum
    plan = plan_for(cfg, 70, 6, 3, tiny)
    assert plan.rows < 10 and not plan.keep_kernel and plan.peak_bytes <= plan.budget
    if reg == "kernel_cl":
        assert plan.passes > 1
    res = train_kernel(cfg, toy_dataset(x, y, 3), memory_gb=tiny)
    m = res.metrics
    assert m["chunk_rows"] == plan.rows and m["kernel_matrix_kept"] is False
    assert m["gamma"] == pytest.approx(gamma, rel=1e-12)  # knn distances in other chunks
    got = [c["loss"] for c in m["curve"]]
    assert len(got) == len(losses)
    np.testing.assert_allclose(got, losses, rtol=1e-10)
    err = (res.model.coef.detach() - coef).abs().max() / coef.abs().max()
    assert err < 1e-9, err
    # the default budget holds everything: the same again
    whole = train_kernel(cfg, toy_dataset(x, y, 3))
    assert whole.metrics["kernel_matrix_kept"] is True and whole.metrics["gram_passes"] == 1
    err = (whole.model.coef.detach() - coef).abs().max() / coef.abs().max()
    assert err < 1e-9, err
    assert whole.metrics["test_error"] == m["test_error"]


def test_training_beyond_the_budget_stops_with_the_estimate():
    data = toy_dataset(*toy_data(), 3)
    cfg = KernelTrainConfig(regularizer="kernel_cl", n_centers=0, neighbours=10, max_iter=2)
    need = train_minimum_bytes(70, 70, 6, 3, "kernel_cl")
    with pytest.raises(KernelMemoryError, match=r"70 expansion points .* needs at least"):
        train_kernel(cfg, data, memory_gb=0.9 * need / 2**30)
    with pytest.raises(ConfigError, match=r"kernel\.memory_gb"):
        check_device_memory("cpu", 1e6)  # a million GiB: more than this machine has
    check_device_memory("cpu", 1e-3)


@pytest.mark.parametrize("reg", ["kernel_logreg", "kernel_cl"])
def test_plans_fit_their_budget_and_use_it(reg):
    gen = np.random.default_rng(5)
    for _ in range(200):
        n = int(gen.integers(2, 70000))
        N = int(gen.integers(1, n + 1))
        d, K = int(gen.choice([5, 784, 3072])), int(gen.choice([2, 10, 43]))
        device = str(gen.choice(["cpu", "cuda"]))
        need = train_minimum_bytes(n, N, d, K, reg, device)
        budget = int(need * gen.uniform(1.0, 6.0))
        plan = train_plan(n, N, d, K, reg, budget, device)
        assert plan.peak_bytes <= budget, (n, N, d, K, plan)
        assert 1 <= plan.rows <= min(n, 4096) and 1 <= plan.block <= N
        assert plan.passes <= 8
        if budget >= 2 * (need + 8 * (n * N + 3 * n * K + N * N + 4096 * 2 * N)):
            assert plan.keep_kernel and plan.passes == 1, plan  # plenty: nothing recomputed
        with pytest.raises(KernelMemoryError):
            train_plan(n, N, d, K, reg, need - 1, device)

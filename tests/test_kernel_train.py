"""Kernel-LogReg and Kernel-CL (Sections 3.1, 5): closed forms, convexity, L-BFGS optimum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crosslip.data import load_dataset
from crosslip.kernel_train import (
    KernelTrainConfig,
    cross_lipschitz_gram,
    cross_lipschitz_kernel,
    rkhs_norm,
    train_kernel,
)
from crosslip.kernels import GaussianKernelModel
from crosslip.models import class_gradients


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
    res = train_kernel(cfg, x, y, x, y, 3)
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
    res = train_kernel(cfg, ds.x_train, ds.y_train, ds.x_test, ds.y_test, 10)
    assert res.metrics["status"] == "ok"
    assert res.metrics["test_error"] < 0.10  # ~6% measured: 500 centres, 100 L-BFGS steps
    again = train_kernel(cfg, ds.x_train, ds.y_train, ds.x_test, ds.y_test, 10)
    assert torch.equal(again.model.coef, res.model.coef)  # fixed seed: identical
    assert res.metrics["config"]["lr"] is None


def test_unknown_kernel_regularizer_is_rejected():
    with pytest.raises(ValueError, match="kernel_logreg"):
        KernelTrainConfig(regularizer="svm")

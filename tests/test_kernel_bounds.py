"""Gaussian-kernel models and the bound of Proposition 2.2 (Lemma 2.1, soundness, search)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from crosslip.certify.kernel_bounds import (
    KernelProp22Bound,
    Prop22Shared,
    certify_kernel,
    certify_kernel_reference,
    lemma21,
    plan_for,
    prop22_reference,
)
from crosslip.kernel_memory import KernelMemoryError, certify_minimum_bytes, certify_plan
from crosslip.models.kernels import GaussianKernelModel, gamma_from_data, knn_mean_distance

DT = torch.float64
RADII = (0.0, 0.01, 0.1, 0.5, 2.0)

CONFIGS = [  # (d, n centers, K classes, seed, coefficient scale, gamma)
    (2, 3, 2, 0, 1.0, 1.0),
    (5, 12, 3, 1, 0.1, 5.0),
    (10, 25, 4, 2, 3.0, 0.1),
    (20, 40, 6, 3, 1.0, 1.0),
    (8, 30, 5, 4, 0.01, 5.0),
    (3, 17, 4, 5, 10.0, 0.1),
    (15, 8, 2, 6, 0.5, 0.1),
    (4, 40, 6, 7, 2.0, 5.0),
]


def make_model(d, n, k, seed, scale, gamma):
    g = torch.Generator().manual_seed(seed)
    model = GaussianKernelModel(torch.rand(n, d, generator=g, dtype=DT), k, gamma)
    with torch.no_grad():
        model.coef.copy_(torch.randn(k, n, generator=g, dtype=DT) * scale)
    return model


def points(m, d, seed):
    return torch.rand(m, d, generator=torch.Generator().manual_seed(1000 + seed), dtype=DT)


def sample_ball(x, r, count, gen):
    """``count`` points of B_2(x, r) for each row of x (p, d) -> (p, count, d): uniform
    directions, radii r * U^(1/d), a third of them exactly on the sphere."""
    p, d = x.shape
    u = torch.randn(p, count, d, generator=gen, dtype=DT)
    u = u / u.norm(dim=-1, keepdim=True)
    rad = torch.rand(p, count, 1, generator=gen, dtype=DT) ** (1.0 / d)
    rad[:, : count // 3] = 1.0
    return x[:, None, :] + r * rad * u


def project(y, x, r):
    """Euclidean projection of y (..., d) onto B_2(x, r)."""
    h = y - x
    nrm = h.norm(dim=-1, keepdim=True)
    return x + h * torch.where(nrm > r, r / nrm.clamp_min(1e-300), torch.ones_like(nrm))


def grad_diff(model, y, c):
    """``||grad f_c(y) - grad f_j(y)||_2`` for all j, y (..., d) -> (..., K)."""
    shape = y.shape[:-1]
    g = model.class_gradients(y.reshape(-1, y.shape[-1]))
    return (g[:, c : c + 1, :] - g).norm(dim=-1).reshape(*shape, -1)


def ascent_max(model, x, c, r, restarts=10, steps=40, seed=0):
    """Projected gradient ascent of ``||grad f_c(y) - grad f_j(y)||^2`` over B_2(x, r), for
    every class j at once (one copy of the iterates per j). Returns the best value per j."""
    K = model.coef.shape[0]
    gen = torch.Generator().manual_seed(seed)
    y = sample_ball(x[None], r, restarts, gen)[0]  # (restarts, d)
    y = torch.cat([x[None], y])[None].repeat(K, 1, 1)  # (K, restarts + 1, d)
    best = torch.zeros(K, dtype=DT)
    cls = torch.arange(K)
    for t in range(steps + 1):
        y = y.detach().requires_grad_(True)
        val = grad_diff(model, y, c)[cls, :, cls] ** 2  # (K, restarts + 1): class j for copy j
        best = torch.maximum(best, val.detach().max(1).values)
        if t == steps or r == 0:
            break
        (g,) = torch.autograd.grad(val.sum(), y)
        step = r * 0.5 * (1 - t / steps) + 1e-3 * r
        y = project(y + step * g / g.norm(dim=-1, keepdim=True).clamp_min(1e-300), x, r)
    return best.sqrt()


def max_ratio(model, x, bound_fn, radii=RADII, samples=600, seed=0):
    """Largest ``||grad f_c(y) - grad f_j(y)|| / bound_fn(idx, R)_j`` over sampled y in the
    ball and projected-gradient-ascent iterates, over all points, classes and radii."""
    pred = model(x).argmax(1)
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for R in radii:
        L = bound_fn(torch.arange(len(x)), torch.full((len(x),), R, dtype=DT))  # (m, K)
        y = sample_ball(x, R, samples, gen)  # (m, samples, d)
        for i in range(len(x)):
            c = int(pred[i])
            with torch.no_grad():
                seen = grad_diff(model, y[i], c).max(0).values  # (K,)
            seen = torch.maximum(seen, ascent_max(model, x[i], c, R, seed=seed + i))
            ok = torch.arange(len(seen)) != c
            ratio = seen[ok] / L[i, ok].clamp_min(1e-300)
            worst = max(worst, ratio.max().item())
    return worst


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: one thread avoids OpenMP spin-waits on a busy 2-core machine
    (which made this file 20x slower there)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# The model


@pytest.mark.parametrize("cfg", CONFIGS)
def test_forward_and_class_gradients(cfg):
    d, _, k, seed, _, gamma = cfg
    model = make_model(*cfg)
    x = points(7, d, seed)
    direct = (
        model.coef[None]
        * torch.exp(-gamma * ((x[:, None] - model.centers) ** 2).sum(-1))[:, None, :]
    ).sum(-1)
    torch.testing.assert_close(model(x), direct, rtol=1e-12, atol=1e-12)
    xg = x.clone().requires_grad_(True)
    out = model(xg)
    auto = torch.stack(
        [torch.autograd.grad(out[:, j].sum(), xg, retain_graph=True)[0] for j in range(k)], 1
    )
    closed = model.class_gradients(x)
    assert closed.shape == (7, k, d)
    scale_ = auto.abs().max().item() + 1e-30
    assert (closed - auto).abs().max().item() <= 1e-10 * max(1.0, scale_)


def test_model_attributes_and_hyper():
    model = GaussianKernelModel(torch.rand(5, 3, dtype=DT), 4, 0.5)
    assert model.coef.shape == (4, 5) and torch.all(model.coef == 0)
    assert isinstance(model.coef, torch.nn.Parameter)
    assert "centers" in dict(model.named_buffers()) and "centers" in model.state_dict()
    hyper = json.loads(json.dumps(model.hyper))
    assert hyper == {"in_dim": 3, "num_classes": 4, "n_centers": 5, "gamma": 0.5}
    clone = GaussianKernelModel(
        torch.zeros(hyper["n_centers"], hyper["in_dim"], dtype=DT),
        hyper["num_classes"],
        hyper["gamma"],
    )
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone.centers, model.centers)
    with pytest.raises(ValueError):
        GaussianKernelModel(torch.rand(5, 3), 2, 0.0)


# ---------------------------------------------------------------------------------------------
# Lemma 2.1


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [0.1, 1.0, 5.0])
def test_lemma21_bounds_hold_and_are_attained(seed, gamma):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 21))
    x, xr, xs = rng.random((3, d))
    if seed == 0:
        xs = xr.copy()  # r = s
    if seed == 1:
        x = (xr + xs) / 2  # S = 0: x is the midpoint
    P = float((x - xr) @ (x - xs))
    v = 2 * x - xr - xs
    S = float(np.linalg.norm(v))
    sq_r, sq_s = float((x - xr) @ (x - xr)), float((x - xs) @ (x - xs))
    gen = torch.Generator().manual_seed(seed)

    def inner(y):
        return ((y - xr) * (y - xs)).sum(-1)

    def expo(y):
        return np.exp(-gamma * ((xr - y) ** 2).sum(-1)) * np.exp(-gamma * ((xs - y) ** 2).sum(-1))

    for R in (0.0, 0.01, 0.1, 0.5, 2.0, float(rng.random() * 3)):
        i_max, i_min, e_max, e_min = (float(t) for t in lemma21(P, S, sq_r, sq_s, R, gamma))
        y = sample_ball(torch.from_numpy(x)[None], R, 3000, gen)[0].numpy()
        a, e = inner(y), expo(y)
        tol = 1e-12 * (1 + abs(i_max))
        assert np.all(a <= i_max + tol) and np.all(a >= i_min - tol)
        assert np.all(e <= e_max * (1 + 1e-12)) and np.all(e >= e_min * (1 - 1e-12))
        # The explicit optimisers: h = +R v/|v| (max inner, min exp), h = -M v/|v| (min inner,
        # max exp), M = min(S/2, R); for S = 0 any unit direction works.
        u = v / S if S > 0 else np.eye(d)[0]
        M = min(S / 2, R)
        y_plus, y_minus = x + R * u, x - M * u
        assert abs(inner(y_plus) - i_max) <= 1e-9 * max(1.0, abs(i_max))
        assert abs(inner(y_minus) - i_min) <= 1e-9 * max(1.0, abs(i_min))
        assert abs(expo(y_minus) - e_max) <= 1e-9 * e_max
        assert abs(expo(y_plus) - e_min) <= 1e-9 * e_min


# ---------------------------------------------------------------------------------------------
# Proposition 2.2: soundness, not vacuous, equal to the literal formula, monotone


@pytest.mark.parametrize("cfg", CONFIGS)
def test_bound_is_sound(cfg):
    model = make_model(*cfg)
    x = points(4, cfg[0], cfg[3])
    bound = KernelProp22Bound(model, x, model(x).argmax(1))
    assert max_ratio(model, x, bound, seed=cfg[3]) <= 1 + 1e-9


def test_soundness_check_catches_a_wrong_bound():
    """The same check fails for half the bound: it cannot pass vacuously. Also at R > 0,
    where the bound is not just the exact gradient difference at x."""
    for cfg in CONFIGS[:4]:
        model = make_model(*cfg)
        x = points(3, cfg[0], cfg[3])
        bound = KernelProp22Bound(model, x, model(x).argmax(1))

        def half(idx, r, bound=bound):
            return 0.5 * bound(idx, r)

        assert max_ratio(model, x, half, radii=(0.0,), seed=cfg[3]) > 1.9
        assert max_ratio(model, x, half, radii=(0.01,), seed=cfg[3]) > 1.0


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("block", [None, 7])
def test_batched_bound_equals_reference(cfg, block):
    model = make_model(*cfg)
    x = points(5, cfg[0], cfg[3])
    pred = model(x).argmax(1)
    bound = KernelProp22Bound(model, x, pred, block=block)
    for R in (*RADII, 0.37):
        for idx in (torch.arange(5), torch.tensor([3, 0, 4])):
            r = torch.full((len(idx),), R, dtype=DT)
            L, formula = bound(idx, r), bound.formula(idx, r)
            ref = torch.stack([prop22_reference(model, x[i], pred[i], R) for i in idx])
            assert L.shape == ref.shape == (len(idx), cfg[2])
            assert torch.all(L[torch.arange(len(idx)), pred[idx]] == 0)
            torch.testing.assert_close(formula, ref, rtol=1e-9, atol=1e-300)
            # the rounding terms only ever raise the bound, and only a little
            assert torch.all(L >= formula)
            torch.testing.assert_close(L, ref, rtol=1e-6, atol=1e-300)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_bound_at_zero_is_the_exact_gradient_difference(cfg):
    model = make_model(*cfg)
    x = points(5, cfg[0], cfg[3])
    pred = model(x).argmax(1)
    bound = KernelProp22Bound(model, x, pred)
    zero = torch.zeros(5, dtype=DT)
    exact = torch.stack([grad_diff(model, x[i : i + 1], int(pred[i]))[0] for i in range(5)])
    torch.testing.assert_close(
        bound.formula(torch.arange(5), zero), exact.detach(), rtol=1e-9, atol=1e-12
    )
    L0 = bound(torch.arange(5), zero)  # with rounding terms: above it, and close
    assert torch.all(L0 >= exact.detach() * (1 - 1e-12))
    torch.testing.assert_close(L0, exact.detach(), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_bound_is_monotone_in_radius(cfg):
    model = make_model(*cfg)
    x = points(4, cfg[0], cfg[3])
    bound = KernelProp22Bound(model, x, model(x).argmax(1), block=5)
    radii = torch.cat([torch.zeros(1, dtype=DT), torch.logspace(-6, 1, 60, dtype=DT)])
    Ls = torch.stack([bound(torch.arange(4), torch.full((4,), float(r), dtype=DT)) for r in radii])
    steps = Ls[1:] - Ls[:-1]
    assert torch.all(steps >= -1e-12 * Ls[1:].abs())


# ---------------------------------------------------------------------------------------------
# Certification: agreement with the per-point reference and an attack in the certified ball


def margin(model, y, c):
    """``f_c(y) - max_{j != c} f_j(y)`` for y (..., d)."""
    out = model(y.reshape(-1, y.shape[-1]))
    fc = out[:, c]
    other = out.clone()
    other[:, c] = -torch.inf
    return (fc - other.max(1).values).reshape(y.shape[:-1])


def attack(model, x, c, r, restarts=48, steps=100, seed=0):
    """Projected gradient descent on the margin inside B_2(x, r) from many random starts;
    returns the smallest margin seen."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.cat([x[None], sample_ball(x[None], r, restarts, gen)[0]])
    best = torch.inf
    for t in range(steps + 1):
        y = y.detach().requires_grad_(True)
        mg = margin(model, y, c)
        best = min(best, mg.min().item())
        if t == steps:
            break
        (g,) = torch.autograd.grad(mg.sum(), y)
        step = r * (0.5 * (1 - t / steps) + 0.01)
        y = project(y - step * g / g.norm(dim=-1, keepdim=True).clamp_min(1e-300), x, r)
    return best


@pytest.mark.parametrize("cfg", CONFIGS[:5])
def test_certify_matches_per_point_reference(cfg):
    model = make_model(*cfg)
    x = points(6, cfg[0], cfg[3])
    got = certify_kernel(model, x, chunk=4)
    ref = certify_kernel_reference(model, x)
    assert set(got) == {
        "pred",
        "margin",
        "guarantee_local",
        "radius_local",
        "bound_class",
        "evaluations",
    }
    assert torch.equal(got["pred"], ref["pred"])
    assert torch.equal(got["evaluations"], ref["evaluations"])
    # the reference evaluates the formula as printed; certify_kernel adds the rounding terms
    # (margins lowered, bounds raised, both by far less than 1e-6 here)
    torch.testing.assert_close(got["guarantee_local"], ref["guarantee_local"], rtol=1e-6, atol=0)
    torch.testing.assert_close(got["radius_local"], ref["radius_local"], rtol=1e-6, atol=0)
    assert torch.all(got["guarantee_local"] <= ref["guarantee_local"] * (1 + 1e-12))
    again = certify_kernel(model, x, chunk=1)
    torch.testing.assert_close(again["guarantee_local"], got["guarantee_local"], rtol=1e-12, atol=0)


def test_certify_float32_model_and_shapes():
    model = make_model(6, 20, 3, 7, 1.0, 1.0).float()
    x = points(9, 6, 7).float()
    out = certify_kernel(model, x)
    assert all(v.shape == (9,) and v.device.type == "cpu" for v in out.values())
    assert out["guarantee_local"].dtype == DT
    assert torch.all(out["guarantee_local"] >= 0)
    assert torch.all(out["guarantee_local"] <= out["radius_local"] + 1e-15)
    for fn in (certify_kernel, certify_kernel_reference):
        empty = fn(model, x[:0])
        assert set(empty) == set(out) and all(len(v) == 0 for v in empty.values())


@pytest.mark.parametrize("cfg", [CONFIGS[i] for i in (1, 2, 3, 5, 6, 7)])
def test_attack_never_succeeds_inside_certified_ball(cfg):
    model = make_model(*cfg)
    x = points(5, cfg[0], cfg[3])
    cert = certify_kernel(model, x)
    assert torch.all(cert["guarantee_local"] > 0)
    flipped_far = 0
    for i in range(len(x)):
        c, g = int(cert["pred"][i]), float(cert["guarantee_local"][i])
        worst = attack(model, x[i], c, g, seed=i)
        assert worst >= -1e-12 * (1 + abs(float(cert["margin"][i]))), (i, g, worst)
        # The attack is not toothless: far outside the certified ball it does flip.
        flipped_far += attack(model, x[i], c, max(50 * g, 3.0), seed=i) < 0
    assert flipped_far > 0


# ---------------------------------------------------------------------------------------------
# gamma of Section 5


@pytest.mark.parametrize("seed", [0, 1])
def test_gamma_from_data_matches_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(57, 5, generator=g, dtype=DT)
    x[10] = x[3]  # a duplicate: distance 0 counts as a neighbour; only the point itself not
    diff = x[:, None, :] - x[None, :, :]
    dist = (diff**2).sum(-1).sqrt()
    dist.fill_diagonal_(torch.inf)
    rho = dist.sort(1).values[:, :40].mean().item()
    assert knn_mean_distance(x, 40, chunk=7) == pytest.approx(rho, rel=1e-12)
    assert gamma_from_data(x, a=2.0, neighbours=40, chunk=7) == pytest.approx(
        2.0 / rho**2, rel=1e-12
    )
    assert gamma_from_data(x, neighbours=3) == pytest.approx(
        1.0 / dist.sort(1).values[:, :3].mean().item() ** 2, rel=1e-12
    )
    with pytest.raises(ValueError):
        gamma_from_data(x[:40], neighbours=40)


def test_shared_data_is_reused_across_chunks():
    model = make_model(4, 15, 3, 9, 1.0, 1.0)
    x = points(6, 4, 9)
    pred = model(x).argmax(1)
    shared = Prop22Shared(model)
    r = torch.full((3,), 0.2, dtype=DT)
    a = KernelProp22Bound(model, x[:3], pred[:3], shared)(torch.arange(3), r)
    b = KernelProp22Bound(model, x[3:], pred[3:], shared)(torch.arange(3), r)
    alone = KernelProp22Bound(model, x, pred)(torch.arange(6), torch.full((6,), 0.2, dtype=DT))
    torch.testing.assert_close(torch.cat([a, b]), alone, rtol=1e-13, atol=0)


# ---------------------------------------------------------------------------------------------
# Within a memory budget: tiles recomputed instead of the (n, n) arrays


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("block", [None, 5])
def test_streamed_tiles_equal_the_stored_arrays(cfg, block):
    """Without the cached pair arrays and ``H`` every tile is recomputed from the centres:
    the same bounds (to rounding), on all points and on a subset."""
    model = make_model(*cfg)
    x = points(7, cfg[0], cfg[3])
    pred = model(x).argmax(1)
    stored = KernelProp22Bound(model, x, pred, block=block)
    streamed = KernelProp22Bound(
        model, x, pred, Prop22Shared(model, cache=False), block=block, store_h=False
    )
    assert streamed.H is None and not streamed.shared.cached
    for R in RADII:
        for idx in (torch.arange(7), torch.tensor([5, 1, 3])):
            r = torch.full((len(idx),), R, dtype=DT)
            a, b = stored(idx, r), streamed(idx, r)
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-13 * float(a.abs().max()))


@pytest.mark.parametrize("cfg", [CONFIGS[i] for i in (1, 3, 4, 7)])
def test_streamed_bound_is_sound(cfg):
    model = make_model(*cfg)
    x = points(3, cfg[0], cfg[3])
    bound = KernelProp22Bound(
        model, x, model(x).argmax(1), Prop22Shared(model, cache=False), block=7, store_h=False
    )
    assert max_ratio(model, x, bound, samples=300) <= 1.0 + 1e-9


@pytest.mark.parametrize("cfg", CONFIGS[1:5])
def test_certify_within_a_tiny_budget_matches_the_reference(cfg):
    """A budget just above the irreducible part: no cached pair arrays, no stored ``H``, one
    point at a time, tiles of 64 x 64 pairs; the guarantees equal the per-point reference."""
    model = make_model(*cfg)
    x = points(6, cfg[0], cfg[3])
    n, d = model.centers.shape
    k = model.coef.shape[0]
    tiny = (certify_minimum_bytes(n, d, k) + 8 * n * (7 * k + 2) // 2) / 2**30
    plan = plan_for(model, tiny)
    assert not plan.cache_pairs and not plan.store_h and plan.points == 1
    assert plan.peak_bytes <= plan.budget
    got = certify_kernel(model, x, memory_gb=tiny)
    ref = certify_kernel_reference(model, x)
    assert torch.equal(got["pred"], ref["pred"])
    # the reference evaluates the formula as printed; certify_kernel adds the rounding terms
    torch.testing.assert_close(got["guarantee_local"], ref["guarantee_local"], rtol=1e-6, atol=0)
    torch.testing.assert_close(got["radius_local"], ref["radius_local"], rtol=1e-6, atol=0)
    assert torch.all(got["guarantee_local"] <= ref["guarantee_local"] * (1 + 1e-12))
    whole = certify_kernel(model, x)  # the default budget caches everything
    assert plan_for(model).cache_pairs and plan_for(model).store_h
    torch.testing.assert_close(got["guarantee_local"], whole["guarantee_local"], rtol=1e-10, atol=0)
    with pytest.raises(KernelMemoryError, match="needs at least"):
        certify_kernel(model, x, memory_gb=0.5 * certify_minimum_bytes(n, d, k) / 2**30)


def test_certify_plans_fit_their_budget():
    gen = np.random.default_rng(3)
    for _ in range(300):
        n, d, k = (
            int(gen.integers(1, 70000)),
            int(gen.choice([5, 784, 3072])),
            int(gen.choice([2, 10, 43])),
        )
        device = str(gen.choice(["cpu", "cuda"]))
        need = certify_minimum_bytes(n, d, k, device)
        budget = int(need * gen.choice([1.0, 1.5, 4.0, 100.0, 1e4]))
        plan = certify_plan(n, d, k, budget, device)
        assert plan.peak_bytes <= budget, (n, d, k, budget, plan)
        assert plan.points >= 1 and (plan.cache_pairs or not plan.store_h)
    # all 60,000 MNIST points as centres in 70 GiB of a GPU: tiles recomputed, 128 points
    plan = certify_plan(60000, 784, 10, 70 * 2**30, "cuda")
    assert not plan.cache_pairs and plan.points == 128 and plan.peak_bytes < 8 * 2**30

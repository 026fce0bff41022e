"""Box-constrained L1/L2/Linf adversarial samples (Section 4): exactness and validity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import linprog, minimize

from crosslip.attacks import (
    BoxProblem,
    project_box,
    project_box_reference,
    refine_upper_bound,
    upper_bound,
)
from crosslip.certify import certify_softplus, linear_lipschitz, margins, theorem21

from .helpers import random_net, random_points


def random_instances(n, d, seed):
    """Rows with degenerate cases: zero entries of v, points on the box faces, c >= 0,
    infeasible right-hand sides."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    x[torch.rand(n, d, generator=g) < 0.2] = 0.0
    x[torch.rand(n, d, generator=g) < 0.2] = 1.0
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    v[torch.rand(n, d, generator=g) < 0.2] = 0.0
    cap = BoxProblem.build(x, v, 2).capacity
    frac = torch.rand(n, generator=g, dtype=torch.float64) * 1.2  # > 1: infeasible
    c = -frac * cap
    c[:3] = torch.tensor([0.0, 0.5, -0.0])  # already satisfied
    return x, v, c, cap


def test_l2_box_projection_satisfies_kkt():
    x, v, c, cap = random_instances(400, 30, 0)
    prob = BoxProblem.build(x, v, 2)
    delta, lam, feasible = prob.solve(-c)
    assert torch.equal(feasible, -c <= cap * (1 + 1e-12))
    inner = (v * delta).sum(1)
    f = feasible
    # primal feasibility: box always, half-space when feasible
    assert torch.all(x + delta >= -1e-15) and torch.all(x + delta <= 1 + 1e-15)
    assert torch.all(inner[f] <= c[f] + 1e-9 * (1 + c[f].abs()))
    # stationarity: delta = clip(-lambda v, -x, 1-x) with lambda >= 0
    lam_f = lam[f]
    assert torch.all(lam_f >= 0)
    clip = torch.minimum(torch.maximum(-lam_f[:, None] * v[f], -x[f]), 1 - x[f])
    assert torch.allclose(delta[f], clip, atol=1e-12)
    # complementary slackness: lambda > 0 => constraint active
    act = lam_f > 0
    assert torch.allclose(inner[f][act], c[f][act], atol=1e-9, rtol=1e-9)
    assert torch.all(delta[c >= 0] == 0)
    # infeasible rows: flagged, and delta is the box point with the smallest <v, delta>
    inf = ~feasible
    assert inf.any()
    assert torch.allclose(inner[inf], -cap[inf], rtol=1e-12)
    assert not torch.isnan(delta).any()


def test_l2_box_projection_matches_a_qp_solver():
    x, v, c, _cap = random_instances(40, 8, 1)
    delta, feasible = project_box(x, v, c, 2)
    for i in range(len(x)):
        if not feasible[i]:
            continue
        xi, vi, ci = x[i].numpy(), v[i].numpy(), float(c[i])
        res = minimize(
            lambda z: 0.5 * z @ z,
            np.zeros_like(xi),
            jac=lambda z: z,
            method="SLSQP",
            bounds=list(zip(-xi, 1 - xi, strict=True)),
            constraints=[
                {
                    "type": "ineq",
                    "fun": lambda z, vi=vi, ci=ci: ci - vi @ z,
                    "jac": lambda z, vi=vi: -vi,
                }
            ],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        assert res.success, res.message
        assert float(delta[i].norm()) == pytest.approx(np.linalg.norm(res.x), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(
    "seed,d,k,h,scale", [(0, 10, 3, 16, 2.0), (1, 30, 10, 32, 4.0), (2, 5, 5, 8, 1.0)]
)
def test_upper_bounds_are_valid_adversarials_and_above_guarantees(seed, d, k, h, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(60, d, seed)
    ub = upper_bound(net, x, p=2)
    pred = net(x).argmax(1)
    adv = x + ub.delta
    s = ub.success
    assert s.float().mean() > 0.5
    assert torch.all(adv >= 0) and torch.all(adv <= 1)
    with torch.no_grad():
        out = net(adv[s])
    other = out.scatter(1, pred[s][:, None], -float("inf")).max(1).values
    assert torch.all(other > out.gather(1, pred[s][:, None]).squeeze(1))
    assert torch.equal(out.argmax(1), ub.adv_class[s])
    assert torch.allclose(ub.delta[s].norm(dim=1), ub.norm[s])
    assert torch.all(torch.isinf(ub.norm[~s])) and torch.all(ub.target[~s] == -1)
    lower = certify_softplus(net, x)["guarantee_local"]
    assert torch.all(ub.norm >= lower)


# ------------------------------------------------------------------ L1 / Linf / all norms
def lp_optimum(x, v, c, p):
    """``min ||delta||_p s.t. <v, delta> <= c, 0 <= x + delta <= 1`` by linprog: split
    ``delta = a - b`` (a, b >= 0); p = 1 minimizes sum(a + b), p = inf adds an epsilon."""
    d = len(x)
    if p == 1:
        cost = np.ones(2 * d)
        a_ub = [np.concatenate([v, -v])]
        b_ub = [c]
        bounds = [(0, 1 - xi) for xi in x] + [(0, xi) for xi in x]
    else:
        cost = np.concatenate([np.zeros(2 * d), [1.0]])
        eye = np.eye(d)
        a_ub = [np.concatenate([v, -v, [0.0]])]
        a_ub += [np.concatenate([eye[i], np.zeros(d), [-1.0]]) for i in range(d)]
        a_ub += [np.concatenate([np.zeros(d), eye[i], [-1.0]]) for i in range(d)]
        b_ub = [c] + [0.0] * (2 * d)
        bounds = [(0, 1 - xi) for xi in x] + [(0, xi) for xi in x] + [(0, None)]
    res = linprog(cost, A_ub=np.array(a_ub), b_ub=np.array(b_ub), bounds=bounds, method="highs")
    return res


@pytest.mark.parametrize("p", [1.0, math.inf])
def test_l1_and_linf_box_projections_match_an_lp_solver(p):
    x, v, c, _ = random_instances(60, 10, 4)
    prob = BoxProblem.build(x, v, p)
    delta, _, feasible = prob.solve(-c)
    assert torch.all(x + delta >= 0) and torch.all(x + delta <= 1)
    assert not torch.isnan(delta).any()
    for i in range(len(x)):
        res = lp_optimum(x[i].numpy(), v[i].numpy(), float(c[i]), p)
        assert (res.status == 0) == bool(feasible[i]), i
        if res.status != 0:  # infeasible: the box point with the largest decrease
            assert float((v[i] * delta[i]).sum()) == pytest.approx(-float(prob.capacity[i]))
            continue
        inner = float((v[i] * delta[i]).sum())
        assert inner <= float(c[i]) + 1e-9 * (1 + abs(float(c[i])))
        norm = float(torch.linalg.vector_norm(delta[i], ord=p))
        assert norm == pytest.approx(res.fun, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_batched_projection_equals_the_per_row_reference(p):
    x, v, c, _ = random_instances(80, 25, 5)
    delta, _ = project_box(x, v, c, p)
    ref = project_box_reference(x, v, c, p)
    norms = [torch.linalg.vector_norm(z, ord=p, dim=1) for z in (delta, ref)]
    assert torch.allclose(*norms, rtol=1e-9, atol=1e-12)
    if p != math.inf:  # the L1 and L2 minimizers are unique up to ties
        assert torch.allclose(delta, ref, atol=1e-9)


def test_projection_rejects_points_outside_the_box_and_unknown_norms():
    x = torch.full((2, 3), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match="box"):
        BoxProblem.build(x + 1, x)
    with pytest.raises(ValueError, match="p = 3"):
        BoxProblem.build(x, x, p=3)


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_linear_classifier_upper_bound_equals_exact_distance_in_every_norm(p):
    """Interior points, boundary far from the box faces: the p-distance to the nearest
    decision boundary is the upper bound and the guarantee (Theorem 2.1 is tight)."""
    q = {1.0: math.inf, 2.0: 2.0, math.inf: 1.0}[p]
    g = torch.Generator().manual_seed(3)
    d, k = 20, 4
    lin = torch.nn.Linear(d, k).double()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(k, d, generator=g, dtype=torch.float64))
        lin.bias.copy_(-0.5 * lin.weight.sum(1))  # every boundary passes the box centre
    x = 0.5 + 0.01 * torch.randn(50, d, generator=g, dtype=torch.float64)
    logits = lin(x).detach()
    pred = logits.argmax(1)
    W = lin.weight.detach()
    lip = torch.linalg.vector_norm(W[pred][:, None, :] - W[None], ord=q, dim=-1)
    dist = (logits.gather(1, pred[:, None]) - logits) / lip
    dist = dist.scatter(1, pred[:, None], math.inf).min(1).values
    assert torch.all(dist < 0.3)  # the minimizers stay inside [0, 1]^d
    cert = theorem21(margins(logits, pred), linear_lipschitz(W, pred, q), rtol=1e-9)
    assert torch.allclose(cert.guarantee, dist, rtol=1e-12)
    ub = upper_bound(lin, x, p=p, rtol=1e-7, max_steps=80)
    assert torch.all(ub.success)
    assert torch.allclose(ub.norm, dist, rtol=1e-5)
    assert torch.all(ub.norm >= cert.guarantee * (1 - 1e-12))


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_refined_upper_bounds_are_valid_and_never_worse(p):
    net = random_net(15, 5, 24, 7, 3.0)
    x = random_points(60, 15, 7)
    paper = upper_bound(net, x, p=p)
    refined = refine_upper_bound(net, x, paper, p=p, steps=5)
    pred = net(x).argmax(1)
    s = refined.success
    assert torch.equal(s, paper.success) and s.float().mean() > 0.5
    assert torch.all(refined.norm <= paper.norm)
    assert torch.any(refined.norm < paper.norm * 0.999)  # it does improve somewhere
    adv = x + refined.delta
    assert torch.all(adv >= 0) and torch.all(adv <= 1)
    with torch.no_grad():
        out = net(adv[s])
    other = out.scatter(1, pred[s][:, None], -math.inf).max(1).values
    assert torch.all(other > out.gather(1, pred[s][:, None]).squeeze(1))
    assert torch.allclose(torch.linalg.vector_norm(refined.delta[s], ord=p, dim=1), refined.norm[s])
    col = {1.0: "guarantee_l1", 2.0: "guarantee_l2", math.inf: "guarantee_linf"}[p]
    lower = certify_softplus(net, x, kinds=("l2", "l1", "linf", "box"))
    assert torch.all(refined.norm >= lower[col + "_box"])  # the attack stays in the box


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_rows_that_cannot_win_stop_early_and_change_no_result(p, monkeypatch):
    """The search drops a target whose norm at its unchanged ``t`` already exceeds another
    target's norm at a changed ``t`` (and, refining, a row that can no longer beat the
    bound it must beat): the per-point results are exactly those of searching every row to
    the end, for fewer rows evaluated."""
    from crosslip.attacks import upper_bounds

    original = upper_bounds._search

    def run(prune: bool):
        rows_seen = []

        def search(logits_of, *args, point=None, bound=None):
            def counted(xr, rows):
                rows_seen.append(len(rows))
                return logits_of(xr, rows)

            if not prune:
                point = bound = None
            return original(counted, *args, point=point, bound=bound)

        monkeypatch.setattr(upper_bounds, "_search", search)
        net = random_net(15, 6, 24, 3, 3.0)
        x = random_points(40, 15, 4)
        paper = upper_bound(net, x, p=p)
        refined = refine_upper_bound(net, x, paper, p=p, steps=3)
        return paper, refined, sum(rows_seen)

    (paper, refined, pruned), (paper0, refined0, full) = run(True), run(False)
    for got, want in ((paper, paper0), (refined, refined0)):
        for field in ("norm", "target", "adv_class", "success", "pred", "delta"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert pruned < 0.8 * full, (pruned, full)

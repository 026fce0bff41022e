"""The minimal-norm L2 attack (crosslip.attacks.min_norm_attack): exact on linear
classifiers (with and without an active box), never a sample that does not change the
class, never below a certified guarantee, at least as good as the paper's procedure and its
refinement on a trained network, and free of tensors created off the inputs' device."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from crosslip.attacks import (
    UpperBound,
    min_norm_attack,
    project_box,
    refine_upper_bound,
    upper_bound,
)
from crosslip.certify import certify
from crosslip.models.kernels import GaussianKernelModel
from crosslip.models.resnet import ResNet
from crosslip.models.torch_softplus import TorchSoftplusNet
from crosslip.norms import dual_exponent

from .helpers import random_net, random_points

DT = torch.float64
#: The class must change strictly, so no sample lies exactly on the boundary: the final
#: projection's search on the boundary stops at rtol = 1e-4 (the default; its reported,
#: changed end is at most rtol / (1 - rtol) above the exact distance), and a sample counts
#: only where another class wins by a margin of about 1e-9 relative, reached by enlarging
#: a boundary sample by 1e-12 to 1e-6 in practice (the module docstring). Without the
#: projection the walks alone end up to about 2e-4 above on the box case.
EXACT_RTOL = 1e-4 / (1 - 1e-4) + 1e-6


def linear_model(d: int, k: int, seed: int, spread: float = 1.0) -> nn.Linear:
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(d, k).to(DT)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(k, d, generator=g, dtype=DT))
        lin.bias.copy_(-0.5 * lin.weight.sum(1) + spread * torch.randn(k, generator=g, dtype=DT))
    return lin.eval()


def exact_linear_distance(
    lin: nn.Linear, x: torch.Tensor, box: bool, p: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The minimal p-norm distance of each point to a point where some class scores at
    least f_c (exact for a linear classifier): per target j, ``min ||delta||_p s.t.
    <w_c - w_j, delta> <= -(f_c - f_j)``, inside [0, 1]^d (the exact box-constrained
    projection, Section 4) or not (``(f_c - f_j) / ||w_c - w_j||_q``); the minimum over j.
    Also the unconstrained distance, to tell whether the box is active."""
    with torch.no_grad():
        logits = lin(x)
    n, k = logits.shape
    c = logits.argmax(1)
    w = lin.weight.detach()
    v = w[c][:, None, :] - w[None]  # (n, K, d)
    gap = logits.gather(1, c[:, None]) - logits  # (n, K), >= 0
    free = gap / torch.linalg.vector_norm(v, ord=dual_exponent(p), dim=2)
    free = free.scatter(1, c[:, None], math.inf).min(1).values
    if not box:
        return free, free
    xs = x.repeat_interleave(k, 0)
    delta, feasible = project_box(xs, v.reshape(n * k, -1), -gap.reshape(-1), p)
    norms = torch.linalg.vector_norm(delta, ord=p, dim=1)
    dist = torch.where(feasible, norms, math.inf).view(n, k)
    return dist.scatter(1, c[:, None], math.inf).min(1).values, free


def assert_verified(
    model: nn.Module, x: torch.Tensor, res: UpperBound, lo=0.0, hi=1.0, p: float = 2.0
):
    """Recomputed here: every success changes the class strictly at ``x + delta`` inside
    the box, with ``norm = ||delta||`` and ``adv_class`` the class there; every failure is
    inf with no sample."""
    model = model.to(DT).eval()
    x = x.to(DT)
    with torch.no_grad():
        pred = model(x).argmax(1)
    assert torch.equal(res.pred, pred)
    s = res.success
    assert torch.equal(s, torch.isfinite(res.norm))
    adv = x[s] + res.delta[s]
    assert torch.all(adv >= lo) and torch.all(adv <= hi)
    with torch.no_grad():
        out = model(adv)
    fc = out.gather(1, pred[s][:, None]).squeeze(1)
    other, cls = out.scatter(1, pred[s][:, None], -math.inf).max(1)
    assert torch.all(other > fc)
    assert torch.equal(cls, res.adv_class[s])
    torch.testing.assert_close(torch.linalg.vector_norm(res.delta[s], ord=p, dim=1), res.norm[s])
    assert torch.all(res.delta[~s] == 0) and torch.all(res.target[~s] == -1)
    assert torch.all(res.adv_class[~s] == -1)


@pytest.mark.parametrize("box", [False, True])
def test_linear_classifier_exact_minimal_distance(box):
    """Without ``start``: the walks alone find the exact minimal box-constrained L2
    distance. ``box`` False: points near the centre, every minimizer inside the box (the
    box is inactive); True: points near the faces where the box binds on most of them."""
    d, k = 12, 5
    lin = linear_model(d, k, seed=1 + box)
    g = torch.Generator().manual_seed(3)
    if box:  # near the faces: half the coordinates at 0 or 1
        x = torch.rand(40, d, generator=g, dtype=DT)
        x = torch.where(torch.rand(40, d, generator=g) < 0.5, x.round(), x)
    else:
        x = 0.5 + 0.02 * torch.randn(40, d, generator=g, dtype=DT)
    exact, free = exact_linear_distance(lin, x, box)
    if box:
        assert (exact > free * 1.01).float().mean() > 0.5  # the box binds
    else:
        assert torch.all(exact < 0.3)  # the unconstrained minimizers stay in the box
    # every walk to its end (patience 0): the walks' exactness, not the early stopping's
    res = min_norm_attack(lin, x, steps=100, targets=k - 1, restarts=2, patience=0, progress=False)
    assert_verified(lin, x, res)
    ok = torch.isfinite(exact)
    assert torch.equal(res.success, ok) and ok.float().mean() > 0.9
    assert torch.all(res.norm[ok] >= exact[ok] * (1 - 1e-12))  # a real sample: never below
    assert torch.all(res.norm[ok] <= exact[ok] * (1 + EXACT_RTOL))


@pytest.mark.parametrize("p", [1.0, math.inf])
@pytest.mark.parametrize("box", [False, True])
def test_linear_classifier_exact_minimal_distance_in_l1_and_linf(p, box):
    """The same in L1 and L-inf: the walks, then the polish's exact projection, find the
    exact minimal box-constrained distance of a linear classifier, every sample verified
    and never below it (in L1 with the box binding, within 1% on every point and exact on
    nine in ten: the sparse optimum there is the polish's, from the class a walk reached)."""
    d, k = 12, 5
    lin = linear_model(d, k, seed=7 + box)
    g = torch.Generator().manual_seed(5)
    if box:
        x = torch.rand(30, d, generator=g, dtype=DT)
        x = torch.where(torch.rand(30, d, generator=g) < 0.5, x.round(), x)
    else:
        x = 0.5 + 0.01 * torch.randn(30, d, generator=g, dtype=DT)
    exact, _ = exact_linear_distance(lin, x, box, p)
    res = min_norm_attack(
        lin, x, p=p, steps=100, targets=k - 1, restarts=2, patience=0, progress=False
    )
    assert_verified(lin, x, res, p=p)
    ok = torch.isfinite(exact)
    assert torch.equal(res.success, ok) and ok.float().mean() > 0.8
    ratio = res.norm[ok] / exact[ok]
    assert torch.all(ratio >= 1 - 1e-12)
    if p == 1 and box:
        assert torch.all(ratio <= 1.01) and (ratio > 1 + EXACT_RTOL).float().mean() <= 0.1
    else:
        assert torch.all(ratio <= 1 + EXACT_RTOL)


def test_l1_ball_projection_is_the_closest_point_of_the_ball():
    """Duchi's projection against the optimality conditions: inside the ball, and no
    random point of the ball is closer to ``v``; rows already inside are unchanged."""
    from crosslip.attacks.min_norm import project_l1_ball

    g = torch.Generator().manual_seed(0)
    v = torch.randn(20, 9, generator=g, dtype=DT)
    radius = torch.rand(20, generator=g, dtype=DT) * 3
    radius[:3] = 100.0  # inside
    w = project_l1_ball(v, radius)
    assert torch.all(w.abs().sum(1) <= radius * (1 + 1e-12))
    assert torch.equal(w[:3], v[:3])
    cand = torch.randn(500, 20, 9, generator=g, dtype=DT)
    scale = radius[None, :, None] / cand.abs().sum(2, keepdim=True)
    cand = cand * scale * torch.rand(500, 20, 1, generator=g, dtype=DT)
    assert torch.all((w - v).norm(dim=1) <= (cand - v[None]).norm(dim=2).min(0).values + 1e-12)


def test_a_class_that_can_never_lose_gets_failures_not_samples():
    """Class 0 wins everywhere in the box (equal weights, a larger bias): every point
    fails, with no sample; another class wins beyond the box only: still no sample."""
    lin = nn.Linear(4, 3).to(DT)
    with torch.no_grad():
        lin.weight.zero_()
        lin.weight[1, 0] = 1.0  # f_1 = x_0 - 2 > f_0 = 0 needs x_0 > 2: outside the box
        lin.bias.copy_(torch.tensor([0.0, -2.0, -1.0], dtype=DT))
    x = random_points(10, 4, 0)
    res = min_norm_attack(lin, x, steps=20, restarts=2, progress=False)
    assert not res.success.any()
    assert torch.all(torch.isinf(res.norm)) and torch.all(res.delta == 0)
    assert torch.all(res.target == -1) and torch.all(res.adv_class == -1)
    with torch.no_grad():  # constant logits: a zero gradient everywhere, no NaN anywhere
        lin.weight.zero_()
    res = min_norm_attack(lin, x, steps=20, restarts=2, progress=False)
    assert not res.success.any() and torch.all(res.delta == 0)


def other_model(kind: str, d: int, k: int, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    if kind == "kernel":
        model = GaussianKernelModel(torch.rand(15, d, generator=g, dtype=DT), k, gamma=2.0)
        with torch.no_grad():
            model.coef.copy_(torch.randn(k, 15, generator=g, dtype=DT))
        return model.eval()
    if kind == "torch_softplus":
        torch.manual_seed(seed)
        return TorchSoftplusNet(d, k, hidden=16, beta=3.0, threshold=2.0).to(DT).eval()
    if kind == "resnet":  # flat inputs of 4 x 4 x 1 images
        torch.manual_seed(seed)
        net = ResNet((4, 4, 1), num_classes=k, n=1).to(DT).eval()
        with torch.no_grad():  # a random ResNet is nearly constant: spread its logits
            net.fc.weight.mul_(50.0)
            net.fc.bias.sub_(net(random_points(64, d, seed)).mean(0))
        return net
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 12), nn.Tanh(), nn.Linear(12, k)).to(DT).eval()


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    kind=st.sampled_from(["softplus", "softplus", "kernel", "torch_softplus", "tanh"]),
    d=st.integers(2, 10),
    k=st.integers(2, 5),
    h=st.integers(2, 24),
    scale=st.floats(0.5, 8.0),
    seed=st.integers(0, 10_000),
    warm=st.booleans(),
)
def test_every_sample_changes_the_class_and_none_beats_the_guarantee(
    kind, d, k, h, scale, seed, warm
):
    """Random models (one-hidden-layer softplus nets, kernels, PyTorch softplus, tanh):
    every reported success is a verified sample in the box (recomputed), and none is
    closer than the certified L2 guarantee of Theorem 2.1 (a sound lower bound) where the
    model has one."""
    model = (
        random_net(d, k, h, seed, scale) if kind == "softplus" else other_model(kind, d, k, seed)
    )
    x = random_points(6, d, seed + 1)
    start = upper_bound(model, x, p=2, progress=False) if warm else None
    res = min_norm_attack(model, x, start=start, steps=20, targets=2, restarts=2, progress=False)
    assert_verified(model, x, res)
    if start is not None:  # never worse than the start (up to the nudge across the boundary)
        assert torch.all(res.norm[start.success] <= start.norm[start.success] * (1 + 1e-4))
    if kind != "tanh":  # the tanh net has no guarantee
        cert = certify(model, x, kinds=("l2",), rtol=1e-4).columns
        assert torch.all(res.norm >= cert["guarantee_l2"])


def test_resnet_on_flat_inputs():
    model = other_model("resnet", 16, 3, 0)
    x = random_points(6, 16, 2)
    res = min_norm_attack(model, x, steps=10, targets=1, restarts=1, polish_steps=1, progress=False)
    assert res.success.float().mean() > 0.5
    assert_verified(model, x, res)


@pytest.fixture(scope="module")
def trained_net():
    """A 784-64-10 softplus net after 2 epochs of SGD on 4,000 digits of mnist5k."""
    from crosslip.data import load_dataset
    from crosslip.training.core import TrainConfig
    from crosslip.training.single import train

    ds = load_dataset("mnist5k")
    cfg = TrainConfig(epochs=2, lr=0.2, hidden=64)
    res = train(cfg, ds)
    return res.model.double().eval(), torch.as_tensor(ds.x_test[:30]).double()


def test_at_least_as_good_as_the_paper_and_the_refinement(trained_net):
    """From the refined samples it is never worse than the paper's procedure and its
    refinement (pointwise, up to the nudge across the boundary) and smaller on average; on
    its own, without a start, its mean is not above theirs either (the refinement is close
    to optimal on this nearly linear network: the margins are small)."""
    net, x = trained_net
    paper = upper_bound(net, x, p=2, progress=False)
    refined = refine_upper_bound(net, x, paper, p=2, progress=False)
    ok = paper.success
    assert ok.all()
    warm = min_norm_attack(net, x, start=refined, steps=30, restarts=2, progress=False)
    assert_verified(net, x, warm)
    assert torch.all(warm.success)
    assert torch.all(warm.norm <= torch.minimum(paper.norm, refined.norm) * (1 + 1e-4))
    assert warm.norm.mean() < refined.norm.mean() <= paper.norm.mean()
    cold = min_norm_attack(net, x, steps=30, targets=9, restarts=2, patience=0, progress=False)
    assert_verified(net, x, cold)
    assert cold.norm.mean() <= refined.norm.mean() * (1 + 1e-4)


def test_deterministic_for_a_seed():
    net = random_net(6, 4, 12, 0, 4.0)
    x = random_points(10, 6, 0)
    a, b = (min_norm_attack(net, x, steps=20, restarts=3, seed=5, progress=False) for _ in "ab")
    for f in UpperBound.__annotations__:
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_no_tensor_is_created_off_the_inputs_device():
    """Inside ``torch.device("meta")`` any tensor made without an explicit device lands on
    the meta device, and mixing it with the CPU inputs fails: the attack (walks, restarts,
    polish, warm start, several batches) creates every tensor on the inputs' device."""
    net = random_net(5, 3, 8, 1, 3.0)
    x = random_points(12, 5, 1)
    start = upper_bound(net, x, p=2, progress=False)
    want = min_norm_attack(net, x, start=start, steps=10, restarts=2, batch_size=40, progress=False)
    with torch.device("meta"):
        got = min_norm_attack(
            net, x, start=start, steps=10, restarts=2, batch_size=40, progress=False
        )
    assert got.norm.device.type == "cpu"
    assert torch.equal(got.norm, want.norm)


def test_rejects_settings_without_a_walk():
    net = random_net(3, 2, 4, 0)
    x = random_points(2, 3, 0)
    with pytest.raises(ValueError, match="steps"):
        min_norm_attack(net, x, steps=0)
    with pytest.raises(ValueError, match="restarts"):
        min_norm_attack(net, x, restarts=-1)


class CountingModel(nn.Module):
    """``model`` that records the rows of every forward pass (the batch's size)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.rows = model, []
        self.eval()  # in eval mode the attack uses it as it is, no copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(x.shape[0])
        return self.model(x)


#: The early stopping of the tests: a walk stops once its best norm has not improved by a
#: relative 1e-3 for 10 steps (the schema's default).
EARLY = {"tol": 1e-3, "patience": 10}


def test_early_stopped_walks_stay_within_tolerance_of_the_full_budget(trained_net):
    """On a fixed trained net, from the refined samples: stopped early, with the targets
    pruned by their linearized distance, every point gets a verified sample whose norm is
    at most 1% above the full budget's (every walk to its end, every target), 0.1%
    on average; and it never returns an unverified sample."""
    net, x = trained_net
    paper = upper_bound(net, x, p=2, progress=False)
    refined = refine_upper_bound(net, x, paper, p=2, progress=False)
    kw = {"start": refined, "steps": 50, "targets": 4, "restarts": 1, "progress": False}
    full = min_norm_attack(net, x, **kw, patience=0, prune=0.0)
    for prune in (0.0, 1.5):
        early = min_norm_attack(net, x, prune=prune, **kw, **EARLY)
        assert_verified(net, x, early)
        assert torch.equal(early.success, full.success) and early.success.all()
        ratio = early.norm / full.norm
        assert torch.all(ratio <= 1.01), ratio.max()
        assert ratio.mean() <= 1.001
        assert torch.all(early.norm <= refined.norm * (1 + 1e-4))  # never worse than the start


def test_stopped_rows_leave_the_batch():
    """The forward passes of an early-stopped walk shrink as rows stop (each pass is the
    rows still walking), and the whole attack evaluates far fewer rows than the full
    budget; with ``patience`` 0 every row walks every step."""
    net = random_net(8, 4, 16, 2, 4.0)
    x = random_points(40, 8, 2)
    start = upper_bound(net, x, p=2, progress=False)
    full, early = CountingModel(net), CountingModel(net)
    kw = {"start": start, "steps": 60, "targets": 3, "restarts": 2, "polish_steps": 0}
    kw["prune"] = 0.0  # every target walked: the rows stop by early stopping alone
    min_norm_attack(full, x, **kw, patience=0, progress=False)
    min_norm_attack(early, x, **kw, **EARLY, progress=False)
    walk = [r for r in full.rows if r == 4 * len(x)]  # (i) and (ii): 1 + 3 rows per point
    assert len(walk) == 61  # 60 steps and the check of the last iterates
    rows = early.rows[early.rows.index(4 * len(x)) :][:60]
    assert rows[-1] < rows[0] and all(a >= b for a, b in itertools.pairwise(rows) if b > 1)
    assert sum(early.rows) < 0.8 * sum(full.rows)


def test_pruning_by_the_linearized_distance_never_drops_the_best_target():
    """On a linear classifier the linearized distance ``(f_c - f_j) / ||w_c - w_j||`` of a
    target is a lower bound on the distance to any sample of that target (exact without
    the box, larger with it), so a target above a sample's norm cannot give a smaller one:
    with ``prune`` 1 the attack finds the same exact minimal distances as with every target
    walked, in fewer rows; the best target (the exact minimizer's) is never pruned."""
    d, k = 12, 6
    lin = linear_model(d, k, seed=4)
    g = torch.Generator().manual_seed(5)
    x = torch.rand(40, d, generator=g, dtype=DT)
    x = torch.where(torch.rand(40, d, generator=g) < 0.5, x.round(), x)  # the box binds
    exact, _ = exact_linear_distance(lin, x, box=True)
    # a loose start and no polish, so that only the walks can reach the exact distances
    start = upper_bound(lin, x, p=2, rtol=0.1, progress=False)
    assert torch.any(start.norm > exact * (1 + EXACT_RTOL))
    walked, pruned = CountingModel(lin), CountingModel(lin)
    kw = {"start": start, "steps": 100, "targets": k - 1, "restarts": 0, "progress": False}
    kw["polish_steps"] = 0
    every = min_norm_attack(walked, x, **kw, patience=0, prune=0.0)
    some = min_norm_attack(pruned, x, **kw, patience=0, prune=1.0)
    assert sum(pruned.rows) < sum(walked.rows)
    ok = torch.isfinite(exact)
    for res in (every, some):
        assert_verified(lin, x, res)
        assert torch.equal(res.success, ok)
        assert torch.all(res.norm[ok] <= exact[ok] * (1 + EXACT_RTOL))

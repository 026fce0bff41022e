"""Device discipline checked on the CPU, in every run: what the CUDA tests (tests/test_cuda.py,
skipped without a GPU) rely on.

* The CUDA tests' model learns: the same data and parameters trained on the CPU stay below
  the same test error.
* No tensor is created on an unstated device: the stages run on CPU inputs with torch's
  default device set to ``meta`` (:func:`tests.device_checks.implicit_tensors_on_meta`), so a
  tensor made without ``device=`` (one that would sit on the CPU while its inputs are on a
  GPU) is a meta tensor, and mixing it with the real tensors or reading it raises. Each
  result equals that of a normal run exactly.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from crosslip.attacks import (
    BoxProblem,
    project_box,
    project_box_reference,
    refine_upper_bound,
    upper_bound,
)
from crosslip.certify import certify
from crosslip.certify.kernel_bounds import certify_kernel
from crosslip.data import Dataset, save_prepared
from crosslip.io.files import read_json, write_json
from crosslip.kernel_memory import GIB, certify_minimum_bytes, train_minimum_bytes
from crosslip.models.checkpoints import load_model, save_model
from crosslip.models.kernels import GaussianKernelModel
from crosslip.models.torch_softplus import from_sequential
from crosslip.pipeline import attack_stage, certify_stage, train_stage
from crosslip.training.core import TrainConfig
from crosslip.training.kernel import KernelTrainConfig, plan_for, train_kernel
from crosslip.training.single import train

from .device_checks import assert_same, implicit_tensors_on_meta
from .helpers import (
    LEARNABLE_ERROR,
    LEARNABLE_NET,
    learnable_digits,
    random_net,
    random_points,
    toy_dataset,
)


def test_the_cuda_tests_model_learns_on_the_cpu(tmp_path):
    """The twin of tests/test_cuda.py's ``trained`` fixture: its data and parameters, on the
    CPU. A fixture that cannot learn fails here, not first on a GPU."""
    data = learnable_digits(tmp_path / "d.npz")
    met = train_stage(data, LEARNABLE_NET, "m", tmp_path / "m.pt", tmp_path / "m.json", "cpu")
    assert met["status"] == "ok" and met["device"] == "cpu"
    assert read_json(tmp_path / "m.json")["test_error"] < LEARNABLE_ERROR


# ---------------------------------------------------------------------------------------------
# the check itself


def test_implicit_tensors_on_meta_catches_a_tensor_made_without_the_inputs_device():
    """What the checks below rely on: inside the block a factory call without ``device=``
    makes a meta tensor and using it with real tensors raises; with the inputs' device, or
    for host data said to be host data, the same code runs and gives the normal result."""
    x = torch.rand(5, 3, dtype=torch.float64)

    def centred(x: torch.Tensor, explicit: bool) -> torch.Tensor:
        where = {"device": x.device} if explicit else {}
        return x - torch.ones(3, dtype=x.dtype, **where) * x.mean()

    with implicit_tensors_on_meta():
        assert torch.zeros(2).device.type == "meta"
        assert torch.from_numpy(np.zeros(2)).device.type == "cpu"
        with pytest.raises((RuntimeError, NotImplementedError)):
            centred(x, explicit=False).sum().item()
        got = centred(x, explicit=True)
    assert torch.equal(got, centred(x, explicit=False))


# ---------------------------------------------------------------------------------------------
# models and points, made outside the checks (real CPU tensors)

D, K, H = 12, 4, 10


def kernel_model(n: int = 40, seed: int = 0) -> GaussianKernelModel:
    g = torch.Generator().manual_seed(seed)
    model = GaussianKernelModel(torch.rand(n, D, generator=g, dtype=torch.float64), K, 0.5)
    with torch.no_grad():
        model.coef.copy_(torch.randn(K, n, generator=g, dtype=torch.float64))
    return model.eval()


def sequential_net(seed: int = 0) -> nn.Sequential:
    """A softplus net as ``nn.Sequential`` built elsewhere, float64, PyTorch's threshold."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, H), nn.Softplus(beta=4.0), nn.Linear(H, K)).double()


MODELS = {
    "softplus_net": lambda: random_net(D, K, H, seed=1),
    "kernel": kernel_model,
    "sequential": sequential_net,
}


# ---------------------------------------------------------------------------------------------
# the library's entry points


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_certify_makes_no_tensor_on_an_implicit_device(kind):
    model, x = MODELS[kind](), random_points(6, D, seed=2)
    want = certify(model, x, rtol=1e-4)
    with implicit_tensors_on_meta():
        got = certify(model, x, rtol=1e-4)
    assert got.local_bound == want.local_bound
    assert_same(got.columns, want.columns)


def test_the_trust_region_makes_no_tensor_on_an_implicit_device():
    """``certify.trust_region_steps`` (its row masks, rounds, float32 dual point and batched
    factorisations) inside the block, value for value."""
    model, x = random_net(D, K, H, seed=3, scale=2.0), random_points(6, D, seed=4)
    want = certify(model, x, rtol=1e-4, trust_region_steps=6)
    with implicit_tensors_on_meta():
        got = certify(model, x, rtol=1e-4, trust_region_steps=6)
    assert_same(got.columns, want.columns)


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
@pytest.mark.parametrize("kind", ["softplus_net", "kernel"])
def test_attacks_make_no_tensor_on_an_implicit_device(kind, p):
    model, x = MODELS[kind](), random_points(5, D, seed=3)

    def run():
        start = upper_bound(model, x, p=p, max_steps=20)
        return start, refine_upper_bound(model, x, start, p=p, steps=2, max_steps=20)

    want = run()
    assert bool(want[0].success.any())  # the refinement has samples to work on
    with implicit_tensors_on_meta():
        got = run()
    assert_same(got, want)


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_projections_make_no_tensor_on_an_implicit_device(p):
    g = torch.Generator().manual_seed(4)
    x = torch.rand(7, 30, generator=g, dtype=torch.float64)
    v = torch.randn(7, 30, generator=g, dtype=torch.float64)
    t = -0.5 * BoxProblem.build(x, v, p).capacity

    def run():
        problem = BoxProblem.build(x, v, p)
        return project_box(x, v, t, p), problem.solve(-t), project_box_reference(x, v, t, p)

    want = run()
    with implicit_tensors_on_meta():
        got = run()
    assert_same(got, want)


def test_kernel_training_and_certification_in_chunks_make_no_tensor_on_an_implicit_device():
    """Budgets a little above the irreducible parts: chunked Gram matrix in several passes,
    ``Kt`` recomputed, certification tiles recomputed one point at a time."""
    gen = np.random.default_rng(5)
    x = gen.random((90, D)).astype(np.float32)
    y = (x[:, 0] * K).astype(np.int64).clip(0, K - 1)
    cfg = KernelTrainConfig(regularizer="kernel_cl", lam=1e-2, n_centers=50, neighbours=5)
    cfg = dataclasses.replace(cfg, max_iter=8)
    tiny = (train_minimum_bytes(90, 50, D, K, "kernel_cl") + 8 * 50 * 20) / GIB
    plan = plan_for(cfg, 90, D, K, tiny)
    assert plan.passes > 1 and not plan.keep_kernel

    data = toy_dataset(x, y, K, 30)

    def train():
        return train_kernel(cfg, data, "cpu", memory_gb=tiny)

    want = train()
    with implicit_tensors_on_meta():
        got = train()
    assert_same(got.model.state_dict(), want.model.state_dict())
    for key in ("test_error", "train_error", "curve", "gamma", "lbfgs_iterations"):
        assert got.metrics[key] == want.metrics[key], key
    model, points = want.model, torch.from_numpy(x[30:36]).double()
    small = (certify_minimum_bytes(50, D, K) + 8 * 50 * 10) / GIB
    want = certify_kernel(model, points, memory_gb=small)
    with implicit_tensors_on_meta():
        got = certify_kernel(model, points, memory_gb=small)
    assert_same(got, want)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_load_model_builds_on_the_host(tmp_path, kind):
    """A model file loads onto the CPU (its map_location), whatever the default device."""
    model = MODELS[kind]()
    if kind == "sequential":  # saved as the network crosslip certifies
        model = from_sequential(model)
    save_model(model, tmp_path / "m.pt")
    with implicit_tensors_on_meta():
        got = load_model(tmp_path / "m.pt")
    assert type(got) is type(model)
    assert_same(got.state_dict(), model.state_dict())


@pytest.fixture
def stage_data(tmp_path):
    """A dataset of random points, and a one-hidden-layer net with its metrics."""
    gen = np.random.default_rng(6)
    x = gen.random((120, D)).astype(np.float32)
    y = (x[:, :2].sum(1) * K / 2).astype(np.int64).clip(0, K - 1)
    save_prepared(Dataset("toy", x[:90], y[:90], x[90:], y[90:], (D,), K), tmp_path / "d.npz")
    save_model(random_net(D, K, H, seed=7), tmp_path / "net.pt")
    write_json({"status": "ok", "config": {}}, tmp_path / "net.json")
    return tmp_path


#: Kernel-LogReg on the stage data, within twice its minimum budget (chunks).
STAGE_KERNEL = {"regularizer": "kernel_logreg", "lam": 1e-2, "n_centers": 40, "max_iter": 6}
STAGE_BUDGET = 2 * train_minimum_bytes(90, 40, D, K, "kernel_logreg") / GIB


def test_the_stages_make_no_tensor_on_an_implicit_device(stage_data):
    """The training stage of a kernel model, and the certification and attack stages of it
    and of a net, read from files as the workflow runs them (L2 attacks only: the attack
    test above runs every norm)."""
    folder = stage_data

    def train(name: str) -> dict:
        out = folder / f"{name}.pt", folder / f"{name}.json"
        return train_stage(folder / "d.npz", STAGE_KERNEL, name, *out, "cpu", STAGE_BUDGET)

    want = train("kernel")
    with implicit_tensors_on_meta():
        got = train("kernel-meta")
    for key in ("test_error", "train_error", "curve", "gamma"):
        assert got[key] == want[key], key
    assert_same(
        load_model(folder / "kernel-meta.pt").state_dict(),
        load_model(folder / "kernel.pt").state_dict(),
    )
    for name in ("net", "kernel"):

        def stages(tag: str, name=name) -> list[pd.DataFrame]:
            files = folder / "d.npz", folder / f"{name}.pt", folder / f"{name}.json"
            cert = certify_stage(
                *files,
                folder / f"c{tag}.parquet",
                n_points=8,
                rtol=1e-4,
                device="cpu",
                memory_gb=STAGE_BUDGET,
            )
            att = attack_stage(
                *files,
                folder / f"a{tag}.parquet",
                n_points=8,
                rtol=1e-4,
                max_steps=15,
                norms=["l2"],
                refine_steps=1,
                device="cpu",
            )
            return [cert.drop(columns="certify_seconds"), att.drop(columns="attack_seconds")]

        want = stages(f"{name}-normal")
        assert want[1]["attack_success"].any()
        with implicit_tensors_on_meta():
            got = stages(f"{name}-meta")
        assert_same(got, want)


def test_net_training_makes_no_tensor_on_an_implicit_device():
    gen = np.random.default_rng(8)
    x = gen.random((100, D)).astype(np.float32)
    y = (x[:, 0] * K).astype(np.int64).clip(0, K - 1)
    params = {**LEARNABLE_NET, "hidden": 8, "epochs": 1}

    data = toy_dataset(x, y, K, 20)

    def run():
        return train(TrainConfig(**params), data, device="cpu")

    want = run()
    with implicit_tensors_on_meta():
        got = run()
    assert_same(got.model.state_dict(), want.model.state_dict())
    assert got.metrics["curve"] == want.metrics["curve"]

"""The stages on CUDA give what they give on the CPU (skipped without a GPU): networks and
Gaussian-kernel models, training, certification and attacks, and the benchmarks with
``--device cuda``.

Training on CUDA is not bitwise the CPU's (other kernels, other summation orders), so the
check there is that a CUDA-trained model is a valid model that the CPU stages certify, and
that kernel training on both devices reaches the same test error; the certification and
attack stages of one model are compared value for value across devices.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from crosslip.attacks import BoxProblem, project_box
from crosslip.certify.kernel_bounds import certify_kernel
from crosslip.data import load_prepared
from crosslip.io.files import read_json
from crosslip.models.checkpoints import load_model
from crosslip.pipeline import attack_stage, certify_stage, train_stage

from .helpers import LEARNABLE_ERROR, LEARNABLE_NET, ROOT, TINY_BENCH_ARGS, learnable_digits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


@pytest.fixture
def trained(tmp_path):
    """A net trained on CUDA on digits that it learns in 3 epochs (its CPU twin,
    tests/test_devices.py, checks the same bound on the CPU in every run)."""
    learnable_digits(tmp_path / "d.npz")
    met = train_stage(
        tmp_path / "d.npz", LEARNABLE_NET, "m", tmp_path / "m.pt", tmp_path / "m.json", "cuda"
    )
    assert met["status"] == "ok" and met["device"].startswith("cuda")
    return tmp_path


def test_train_certify_and_attack_on_cuda_match_the_cpu(trained):
    d, m, j = trained / "d.npz", trained / "m.pt", trained / "m.json"
    assert read_json(j)["test_error"] < LEARNABLE_ERROR
    frames = {}
    for dev in ("cpu", "cuda"):
        cert = certify_stage(
            d, m, j, trained / f"c-{dev}.parquet", n_points=40, rtol=1e-4, device=dev
        )
        att = attack_stage(
            d, m, j, trained / f"a-{dev}.parquet", n_points=40, rtol=1e-4, max_steps=40, device=dev
        )
        frames[dev] = (cert, att)
    (c_cpu, a_cpu), (c_gpu, a_gpu) = frames["cpu"], frames["cuda"]
    assert (c_cpu["pred"] == c_gpu["pred"]).all()
    for col in ("guarantee_local", "guarantee_global", "guarantee_l2", "guarantee_linf"):
        pd.testing.assert_series_equal(c_cpu[col], c_gpu[col], rtol=1e-6, check_names=False)
    # every certificate beside the paper's (integrated, linear relaxation, curvature, their
    # box forms and the best of them) in every norm: the same radius on both devices, up
    # to the searches' own tolerance where another summation order moves a step
    columns = [
        c for c in c_cpu.columns if c.startswith("guarantee_") and c != "guarantee_l2_best_method"
    ]
    assert len(columns) >= 30 and list(c_gpu.columns) == list(c_cpu.columns)
    for col in columns:
        np.testing.assert_allclose(c_gpu[col], c_cpu[col], rtol=1e-3, err_msg=col)
    ok = a_cpu["attack_success"] & a_gpu["attack_success"]
    assert ok.mean() > 0.9
    np.testing.assert_allclose(a_cpu["upper_bound"][ok], a_gpu["upper_bound"][ok], rtol=1e-3)
    # soundness on either device: the L2 upper bound (a point in the box) is never below
    # an L2 guarantee, with or without the box
    for col in [c for c in columns if c.startswith(("guarantee_l2", "guarantee_local"))]:
        assert (a_gpu["upper_bound"][ok] >= c_gpu[col][ok] * (1 - 1e-9)).all(), col


def test_the_curvature_certificate_minimised_over_the_ball_on_cuda_matches_the_cpu(trained):
    """``certify.trust_region_steps`` on CUDA (batched Lanczos, eigh and Cholesky there):
    the same radii as on the CPU up to the heuristic's own differences, never below the
    largest-eigenvalue form, never above an upper bound."""
    d, m, j = trained / "d.npz", trained / "m.pt", trained / "m.json"
    cols = ("guarantee_l2_curvature", "guarantee_l2_curvature_box")
    frames = {}
    for dev in ("cpu", "cuda"):
        frames[dev] = certify_stage(
            d,
            m,
            j,
            trained / f"t-{dev}.parquet",
            n_points=30,
            rtol=1e-4,
            device=dev,
            trust_region_steps=6,
        )
    plain = certify_stage(
        d,
        m,
        j,
        trained / "p.parquet",
        n_points=30,
        rtol=1e-4,
        device="cuda",
        trust_region_steps=0,
    )
    att = attack_stage(
        d, m, j, trained / "ta.parquet", n_points=30, rtol=1e-4, max_steps=40, device="cuda"
    )
    ok = att["attack_success"]
    for col in cols:
        np.testing.assert_allclose(frames["cpu"][col], frames["cuda"][col], rtol=1e-3)
        assert (frames["cuda"][col] >= plain[col] * (1 - 1e-9)).all()
        assert (att["upper_bound"][ok] >= frames["cuda"][col][ok] * (1 - 1e-9)).all()


KERNEL = {"regularizer": "kernel_cl", "lam": 1e-2, "a": 1.0, "n_centers": 60, "max_iter": 30}


def test_kernel_training_certification_and_attack_on_cuda_match_the_cpu(trained):
    """A Kernel-CL model trained on either device reaches the same test error; the
    Proposition 2.2 guarantees (the model itself moved to CUDA, and the certify stage with
    device cuda) and the upper bounds of one model agree across devices."""
    d = trained / "d.npz"
    met = {}
    for dev in ("cpu", "cuda"):
        met[dev] = train_stage(
            d, KERNEL, "k", trained / f"k-{dev}.pt", trained / f"k-{dev}.json", device=dev
        )
        assert met[dev]["status"] == "ok" and met[dev]["device"].startswith(dev)
    assert abs(met["cpu"]["test_error"] - met["cuda"]["test_error"]) <= 0.05
    model = load_model(trained / "k-cpu.pt")
    x = torch.as_tensor(load_prepared(d).x_test[:30])
    on_cpu = certify_kernel(model, x, rtol=1e-4)
    on_gpu = certify_kernel(copy.deepcopy(model).to("cuda"), x.to("cuda"), rtol=1e-4)
    assert torch.equal(on_cpu["pred"].cpu(), on_gpu["pred"].cpu())
    torch.testing.assert_close(
        on_gpu["guarantee_local"].cpu(), on_cpu["guarantee_local"], rtol=1e-6, atol=0
    )
    m, j = trained / "k-cpu.pt", trained / "k-cpu.json"
    frames = {}
    for dev in ("cpu", "cuda"):
        cert = certify_stage(
            d, m, j, trained / f"kc-{dev}.parquet", n_points=30, rtol=1e-4, device=dev
        )
        att = attack_stage(
            d,
            m,
            j,
            trained / f"ka-{dev}.parquet",
            n_points=30,
            rtol=1e-4,
            max_steps=40,
            norms=["l2"],
            device=dev,
        )
        frames[dev] = (cert, att)
    (c_cpu, a_cpu), (c_gpu, a_gpu) = frames["cpu"], frames["cuda"]
    pd.testing.assert_series_equal(
        c_cpu["guarantee_local"], c_gpu["guarantee_local"], rtol=1e-6, check_names=False
    )
    ok = a_cpu["attack_success"] & a_gpu["attack_success"]
    assert ok.mean() > 0.9
    np.testing.assert_allclose(a_cpu["upper_bound"][ok], a_gpu["upper_bound"][ok], rtol=1e-3)
    assert (a_gpu["upper_bound"][ok] >= c_gpu["guarantee_local"][ok] * (1 - 1e-9)).all()


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_projections_on_cuda_match_the_cpu(p):
    """Both projection solvers (sort-free and sorted) give the CPU's optimum on CUDA, in
    float64, and stay in the box in float32."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 784, generator=g, dtype=torch.float64)
    x[torch.rand(500, 784, generator=g) < 0.2] = 0.0
    v = torch.randn(500, 784, generator=g, dtype=torch.float64)
    v[torch.rand(500, 784, generator=g) < 0.2] = 0.0
    t = torch.rand(500, generator=g, dtype=torch.float64) * 1.1
    t = t * BoxProblem.build(x, v, p).capacity
    cpu, f_cpu = project_box(x, v, -t, p)
    gpu, f_gpu = project_box(x.cuda(), v.cuda(), -t.cuda(), p)
    sorted_gpu, _, _ = BoxProblem.build(x.cuda(), v.cuda(), p).solve(t.cuda())
    assert torch.equal(f_cpu, f_gpu.cpu())
    n_cpu = torch.linalg.vector_norm(cpu, ord=p, dim=1)
    for z in (gpu, sorted_gpu):
        n = torch.linalg.vector_norm(z.cpu(), ord=p, dim=1)
        torch.testing.assert_close(n, n_cpu, rtol=1e-9, atol=1e-12)
    g32, _ = project_box(x.float().cuda(), v.float().cuda(), -t.float().cuda(), p)
    xg = x.float().cuda() + g32
    assert bool((xg >= 0).all()) and bool((xg <= 1).all())


@pytest.mark.parametrize("bench", sorted(TINY_BENCH_ARGS))
def test_benchmarks_run_on_cuda(bench):
    args = TINY_BENCH_ARGS[bench]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / bench), *args, "--device", "cuda"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.splitlines()
    res = json.loads(out[-1])
    assert res["device"].startswith("cuda") and "(device cuda" in out[0]

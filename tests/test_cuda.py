"""The stages on CUDA give what they give on the CPU (skipped without a GPU).

Training on CUDA is not bitwise the CPU's (other kernels, other summation orders), so the
check there is that a CUDA-trained model is a valid model that the CPU stages certify; the
certification and attack stages of one model are compared value for value across devices.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from crosslip.data import Dataset, save_prepared
from crosslip.io import read_json
from crosslip.pipeline import attack_stage, certify_stage, train_stage

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


@pytest.fixture
def trained(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(300, 20)) / 255).astype(np.float32)
    y = (x[:, :10].mean(1) > x[:, 10:].mean(1)).astype(np.int64) + 2 * (x[:, 0] > 0.5)
    save_prepared(Dataset("toy", x[:240], y[:240], x[240:], y[240:], (20,), 4), tmp_path / "d.npz")
    params = {
        "regularizer": "cross_lipschitz",
        "lam": 1e-3,
        "lr": 0.2,
        "epochs": 3,
        "hidden": 32,
        "seed": 0,
    }
    met = train_stage(
        tmp_path / "d.npz", params, "m", tmp_path / "m.pt", tmp_path / "m.json", device="cuda"
    )
    assert met["status"] == "ok" and met["device"].startswith("cuda")
    return tmp_path


def test_train_certify_and_attack_on_cuda_match_the_cpu(trained):
    d, m, j = trained / "d.npz", trained / "m.pt", trained / "m.json"
    assert read_json(j)["test_error"] < 0.5
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
    ok = a_cpu["attack_success"] & a_gpu["attack_success"]
    assert ok.mean() > 0.9
    np.testing.assert_allclose(a_cpu["upper_bound"][ok], a_gpu["upper_bound"][ok], rtol=1e-3)
    # soundness on either device: the upper bound is never below the guarantee
    assert (a_gpu["upper_bound"][ok] >= c_gpu["guarantee_l2"][ok] * (1 - 1e-9)).all()

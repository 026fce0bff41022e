"""The training benchmark (benchmarks/bench_train.py) still runs and prints what it promises
(tiny sizes; the speed itself is measured by running the benchmark, never asserted here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from .helpers import ROOT


def test_bench_train_runs_and_ends_with_one_json_line():
    args = [
        "--rounds",
        "1",
        "--rounds-1024",
        "1",
        "--block",
        "1",
        "--kernel-centers",
        "50",
        "--kernel-iterations",
        "2",
    ]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.splitlines()
    assert out[0].startswith("machine: ")
    res = json.loads(out[-1])
    for tag in ("", "_batch1024"):
        secs = res[f"step_seconds{tag}"]
        assert set(secs) == {
            "plain",
            "weight_decay",
            "dropout",
            "cross_lipschitz",
            "cross_lipschitz_double_backprop",
            "cross_lipschitz_autograd_backward",
        }
        assert all(math.isfinite(v) and v > 0 for v in secs.values())
        cl = secs["cross_lipschitz"]
        assert math.isclose(res[f"ratio_cl_to_plain{tag}"], cl / secs["plain"])
        assert math.isclose(
            res[f"ratio_cl_to_double_backprop{tag}"], cl / secs["cross_lipschitz_double_backprop"]
        )
        bound = res[f"cl_arithmetic_bound_seconds{tag}"]
        assert math.isclose(res[f"ratio_cl_to_arithmetic_bound{tag}"], cl / bound)
        assert res[f"gemm_gflops_float32{tag}"] > 0
    assert res["kernel_centers"] == 50 and res["kernel_seconds_per_lbfgs_iteration"] > 0
    assert any(line.startswith("kernel (50 centres") for line in out)

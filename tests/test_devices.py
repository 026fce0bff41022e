"""Device discipline checked on the CPU, in every run: what the CUDA tests (tests/test_cuda.py,
skipped without a GPU) rely on.

* The CUDA tests' model learns: the same data and parameters trained on the CPU stay below
  the same test error.
"""

from __future__ import annotations

from crosslip.io import read_json
from crosslip.pipeline import train_stage

from .helpers import LEARNABLE_ERROR, LEARNABLE_NET, learnable_digits


def test_the_cuda_tests_model_learns_on_the_cpu(tmp_path):
    """The twin of tests/test_cuda.py's ``trained`` fixture: its data and parameters, on the
    CPU. A fixture that cannot learn fails here, not first on a GPU."""
    data = learnable_digits(tmp_path / "d.npz")
    met = train_stage(data, LEARNABLE_NET, "m", tmp_path / "m.pt", tmp_path / "m.json", "cpu")
    assert met["status"] == "ok" and met["device"] == "cpu"
    assert read_json(tmp_path / "m.json")["test_error"] < LEARNABLE_ERROR

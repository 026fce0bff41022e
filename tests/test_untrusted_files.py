"""Untrusted files: malicious model.pt and .npz files are refused without running their code."""

from __future__ import annotations

import builtins
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from crosslip.data import Dataset, load_prepared, save_prepared
from crosslip.io.files import write_json
from crosslip.models.checkpoints import load_model
from crosslip.pipeline import (
    certify_stage,
)

# --------------------------------------------------------------------------------------
# 5. untrusted files
# --------------------------------------------------------------------------------------


class Payload:
    """Unpickling this calls ``fn(*args)`` (which creates a marker file)."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def payloads(marker: Path) -> dict[str, Payload]:
    return {
        "os.system": Payload(os.system, (f"touch '{marker}'",)),
        "builtins.exec": Payload(builtins.exec, (f"open({str(marker)!r}, 'w').close()",)),
        "subprocess.call": Payload(subprocess.call, (["touch", str(marker)],)),
    }


@pytest.mark.parametrize("kind", ["os.system", "builtins.exec", "subprocess.call"])
def test_malicious_model_file_is_refused_without_running_code(tmp_path, kind):
    marker = tmp_path / "marker"
    evil = {
        "format": "crosslip.SoftplusNet/1",
        "hyper": "{}",
        "meta": "{}",
        "state_dict": {"hidden_layer.weight": payloads(marker)[kind]},
    }
    torch.save(evil, tmp_path / "model.pt")  # the real (zip) format of model files
    with pytest.raises(ValueError, match="refused to load") as info:
        load_model(tmp_path / "model.pt")
    assert kind.split(".")[-1] in str(info.value) and not marker.exists()
    # a stage that is given the file refuses it too, and writes nothing
    (tmp_path / "toy").mkdir()
    ds = Dataset(
        "toy",
        np.zeros((2, 6), np.float32),
        np.zeros(2, np.int64),
        np.zeros((2, 6), np.float32),
        np.zeros(2, np.int64),
        (6,),
        3,
    )
    save_prepared(ds, tmp_path / "toy" / "d.npz")
    write_json(
        {
            "status": "ok",
            "dataset": "toy",
            "model_id": "m",
            "test_error": 0.5,
            "config": {"regularizer": "none"},
        },
        tmp_path / "toy" / "m.json",
    )
    with pytest.raises(ValueError, match="refused to load"):
        certify_stage(
            tmp_path / "toy" / "d.npz",
            tmp_path / "model.pt",
            tmp_path / "toy" / "m.json",
            tmp_path / "out" / "c.parquet",
            n_points=2,
            rtol=1e-3,
        )
    assert not marker.exists() and not (tmp_path / "out").exists()
    # control: the payload is live (an unrestricted load runs it)
    torch.load(tmp_path / "model.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("kind", ["os.system", "builtins.exec", "subprocess.call"])
def test_malicious_dataset_npz_is_refused_without_running_code(tmp_path, kind):
    marker = tmp_path / "marker"
    arrays = {
        "name": np.array("evil"),
        "x_train": np.array([payloads(marker)[kind]], dtype=object),
        "y_train": np.zeros(1, np.int64),
        "x_test": np.zeros((1, 6), np.uint8),
        "y_test": np.zeros(1, np.int64),
        "shape": np.array([6]),
        "num_classes": np.array(3),
    }
    np.savez(tmp_path / "evil.npz", **arrays)
    with pytest.raises(ValueError, match="allow_pickle") as info:
        load_prepared(tmp_path / "evil.npz")
    assert not marker.exists()
    assert "Object arrays cannot be loaded" in str(info.value)  # numpy's words, no file name
    with np.load(tmp_path / "evil.npz", allow_pickle=True) as z:  # control: the payload is live
        z["x_train"]
    assert marker.exists()


def test_refused_dataset_file_is_named_in_the_message(tmp_path):
    np.savez(tmp_path / "evil.npz", name=np.array("evil"), x_train=np.array([{}], dtype=object))
    with pytest.raises(ValueError) as info:
        load_prepared(tmp_path / "evil.npz")
    assert str(tmp_path / "evil.npz") in str(info.value)

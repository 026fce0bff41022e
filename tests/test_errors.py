"""Expected errors versus bugs: every error a user can fix derives from ``CrosslipError`` and
becomes one line in the job's log; any other exception keeps its traceback there."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from crosslip.certify import certify
from crosslip.data import Dataset, UnsafePickleError, load_dataset, save_prepared
from crosslip.data.idx import IdxFormatError
from crosslip.errors import (
    ChecksumError,
    ConfigError,
    CrosslipError,
    DataFormatError,
    DataUnavailableError,
    ModelFileError,
    UnknownDatasetError,
)
from crosslip.io.files import write_json
from crosslip.models.checkpoints import load_model, save_model
from crosslip.norms import norm_p
from crosslip.report.tables import SUMMARY_COLUMNS
from crosslip.training.core import TrainConfig
from crosslip.training.kernel import KernelTrainConfig

from .helpers import ROOT, random_net

SCRIPTS = ROOT / "workflow" / "scripts"


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (ConfigError, ValueError),
        (DataUnavailableError, RuntimeError),
        (ChecksumError, RuntimeError),
        (DataFormatError, ValueError),
        (IdxFormatError, ValueError),
        (UnsafePickleError, pickle.UnpicklingError),
        (UnknownDatasetError, KeyError),
        (ModelFileError, ValueError),
    ],
)
def test_expected_errors_derive_from_the_base_and_keep_their_builtin_base(cls, builtin):
    assert issubclass(cls, CrosslipError) and issubclass(cls, builtin)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: TrainConfig(regularizer="l2reg"), ["'l2reg'", "cross_lipschitz", "dropout"]),
        (lambda: TrainConfig(adv_norm="l3"), ["'l3'", "l1, l2, linf"]),
        (lambda: TrainConfig(arch="vgg"), ["'vgg'", "mlp, resnet"]),
        (lambda: TrainConfig(regularizer="dropout", keep_hidden=1.5), ["(0, 1]", "1.5"]),
        (lambda: KernelTrainConfig(regularizer="svm"), ["'svm'", "kernel_logreg"]),
        (lambda: norm_p("l3"), ["'l3'", "l1, l2, linf"]),
        (lambda: certify(random_net(3, 2, 4, 0), torch.rand(2, 3), kinds=["l3"]), ["'l3'"]),
    ],
)
def test_bad_values_raise_a_config_error_naming_value_and_allowed(make, words):
    with pytest.raises(ConfigError) as info:
        make()
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_unknown_dataset_message_is_not_quoted_as_a_key():
    with pytest.raises(UnknownDatasetError) as info:
        load_dataset("nope")
    assert str(info.value).startswith("unknown dataset 'nope'; available: ")


@pytest.mark.parametrize(
    "content",
    [b"", b"hello world" * 10, "truncated"],
    ids=["empty", "not-a-torch-file", "truncated"],
)
def test_damaged_model_file_raises_model_file_error_naming_it(tmp_path, content):
    path = tmp_path / "model.pt"
    if content == "truncated":
        save_model(random_net(3, 2, 4, 0), path)
        content = path.read_bytes()[:200]
    path.write_bytes(content)
    with pytest.raises(ModelFileError) as info:
        load_model(path)
    assert str(path) in str(info.value) and "train job" in str(info.value)


def test_plain_torch_file_that_is_no_model_raises_model_file_error(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ModelFileError, match="not a crosslip model file"):
        load_model(tmp_path / "other.pt")


# --------------------------------------------------------------------------------------
# run_script: one line for an expected error, the traceback for anything else
# --------------------------------------------------------------------------------------

RUNNER = """
import sys
from crosslip.errors import ConfigError
from crosslip.io import run_script

def read_metrics(met):
    return met["status"]  # a bug: the key is missing

def main():
    kind = sys.argv[2]
    if kind == "expected":
        raise ConfigError("config key 'certify.rtol': -1 is not positive; set it above 0")
    if kind == "keyerror":
        read_metrics({})
    if kind == "valueerror":
        int("not a number")
    print("torch loaded:", "torch" in sys.modules, flush=True)

run_script(sys.argv[1], main)
"""


def run_runner(tmp_path: Path, kind: str) -> tuple[subprocess.CompletedProcess, str]:
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    log = tmp_path / "logs" / f"{kind}.log"
    proc = subprocess.run(
        [sys.executable, str(script), str(log), kind], capture_output=True, text=True, timeout=120
    )
    return proc, log.read_text()


def test_run_script_logs_an_expected_error_as_one_line(tmp_path):
    proc, log = run_runner(tmp_path, "expected")
    assert proc.returncode == 1
    lines = log.splitlines()
    assert len(lines) == 1, log
    assert lines[0].endswith("config key 'certify.rtol': -1 is not positive; set it above 0")
    assert "ERROR" in lines[0]
    assert "Traceback" not in log and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("kind", "last_line"),
    [("keyerror", "KeyError: 'status'"), ("valueerror", "ValueError: invalid literal")],
)
def test_run_script_keeps_the_traceback_of_an_unexpected_error(tmp_path, kind, last_line):
    """A KeyError or ValueError from a bug is no user error: its traceback, down to the line
    that raised it, is in the log."""
    proc, log = run_runner(tmp_path, kind)
    assert proc.returncode == 1
    assert "unexpected error" in log and "Traceback (most recent call last)" in log
    assert "in main" in log
    if kind == "keyerror":
        assert "in read_metrics" in log and 'return met["status"]' in log
    assert log.splitlines()[-1].startswith(last_line), log
    assert "Traceback" in proc.stderr


def test_run_script_without_threads_does_not_load_torch(tmp_path):
    proc, log = run_runner(tmp_path, "ok")
    assert proc.returncode == 0 and log == "", proc.stderr
    assert "torch loaded: False" in proc.stdout


# --------------------------------------------------------------------------------------
# The workflow's own scripts, run as Snakemake runs them (a `snakemake` object in globals)
# --------------------------------------------------------------------------------------

SCRIPT_RUNNER = """
import json, runpy, sys

class Files(list):  # Snakemake's Namedlist: by position, by name, and its items
    def __init__(self, named):
        super().__init__(named.values())
        self.__dict__.update(named)

    def items(self):
        return dict(self.__dict__).items()

spec = json.loads(sys.argv[2])
class Snakemake:
    input = Files(spec["input"])
    output = Files(spec["output"])
    params = Files(spec["params"])
    log = [spec["log"]]
    threads = spec.get("threads")

try:
    runpy.run_path(sys.argv[1], init_globals={"snakemake": Snakemake}, run_name="__main__")
finally:
    print("torch loaded:", "torch" in sys.modules, flush=True)
"""


def run_workflow_script(
    tmp_path: Path, name: str, **spec
) -> tuple[subprocess.CompletedProcess, str]:
    runner = tmp_path / "run_workflow_script.py"
    runner.write_text(SCRIPT_RUNNER)
    log = tmp_path / "logs" / f"{name}.log"
    cmd = [
        sys.executable,
        str(runner),
        str(SCRIPTS / f"{name}.py"),
        json.dumps({**spec, "log": str(log)}),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return proc, log.read_text()


def test_certify_script_reports_a_damaged_model_file_in_one_line(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(20, 3)) / 255).astype(np.float32)
    y = rng.integers(0, 2, size=20).astype(np.int64)
    save_prepared(Dataset("toy", x[:10], y[:10], x[10:], y[10:], (3,), 2), tmp_path / "toy.npz")
    write_json(
        {"status": "ok", "dataset": "toy", "config": {"regularizer": "none"}},
        tmp_path / "metrics.json",
    )
    model = tmp_path / "model.pt"
    save_model(random_net(3, 2, 4, 0), model)
    model.write_bytes(model.read_bytes()[:300])  # cut short, e.g. by an interrupted copy
    out = tmp_path / "certify.parquet"
    proc, log = run_workflow_script(
        tmp_path,
        "certify",
        input={
            "data": str(tmp_path / "toy.npz"),
            "model": str(model),
            "metrics": str(tmp_path / "metrics.json"),
        },
        output={"table": str(out)},
        params={
            "n_points": 5,
            "rtol": 1e-3,
            "kinds": ["local"],
            "tangent_steps": 0,
            "trust_region_steps": 0,
            "integration_nodes": 8,
            "device": "cpu",
            "memory_gb": 16,
        },
        threads=1,
    )
    assert proc.returncode == 1
    assert len(log.splitlines()) == 1, log
    assert f"{model}: not a readable model file" in log and "Traceback" not in log
    assert not out.exists()


def test_table_script_keeps_the_traceback_of_a_bug_and_draws_without_torch(tmp_path):
    row = {c: np.nan for c in SUMMARY_COLUMNS}
    row.update(
        dataset="toy",
        model_id="m",
        family="mlp",
        regularizer="none",
        setting="plain",
        status="ok",
        test_error=0.1,
        n_eval=4,
        n_correct=3,
        mean_ratio_global_local=2.5,
    )
    good, bad = tmp_path / "summary.csv", tmp_path / "broken.csv"
    pd.DataFrame([row], columns=SUMMARY_COLUMNS).to_csv(good, index=False)
    pd.DataFrame([row]).drop(columns="status").to_csv(bad, index=False)  # an upstream bug
    outs = {k: str(tmp_path / f"table1.{k}") for k in ("csv", "md", "tex")}

    proc, log = run_workflow_script(
        tmp_path, "table", input={"summary": str(good)}, output=outs, params={"table": "table1"}
    )
    assert proc.returncode == 0, log
    assert "torch loaded: False" in proc.stdout
    assert pd.read_csv(outs["csv"])["mean_ratio_global_local"].tolist() == [2.5]

    proc, log = run_workflow_script(
        tmp_path, "table", input={"summary": str(bad)}, output=outs, params={"table": "table1"}
    )
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in log and "in table1" in log
    assert log.splitlines()[-1] == "KeyError: 'status'", log

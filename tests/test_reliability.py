"""Reliability and safety (issue 7): bad input, interruptions and untrusted files never
corrupt results.

1. config: every malformed value is rejected before any job runs, naming the key and the
   allowed values (in process through the Snakemake API for the long list, and a few cases
   through the command line);
2. downloads: a corrupt mirror file fails the workflow's ``prepare_data`` job and a rerun
   after the fix succeeds (the library-level cases live in ``test_data.py`` and
   ``test_data_archives.py``);
3. interruptions: SIGKILL of Snakemake while a model trains and of a certification job,
   Ctrl-C (SIGINT) and a batch system's SIGTERM during a certification; the same command
   redoes exactly the unfinished jobs and the results equal an uninterrupted run; every
   output is written under a temporary name, then renamed;
4. numerics: a diverging model in a sweep, ties, misclassified points and constant models,
   degenerate Gaussian-kernel models (untrained, tied, underflowing), failed attacks;
5. untrusted files: malicious ``model.pt`` and ``.npz`` files are refused without running
   their code;
6. load: a workflow of more than 50 jobs on 2 cores loses and duplicates no row.

Nothing here reaches the internet: the data is embedded (mnist5k) or a local mirror, and
the Snakemake processes get proxies that point at a closed loopback port.
"""

from __future__ import annotations

import base64
import builtins
import copy
import gzip
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from crosslip import pipeline
from crosslip.attacks import upper_bound
from crosslip.certify import certify_softplus
from crosslip.data import ChecksumError, Dataset, load_dataset, load_prepared, save_prepared
from crosslip.io import atomic_path, read_json, write_json
from crosslip.kernels import GaussianKernelModel
from crosslip.models import SoftplusNet, load_model, save_model
from crosslip.pipeline import (
    GUARANTEE_COLUMNS,
    INSTANCE_SCHEMA,
    attack_stage,
    certify_stage,
    instances_stage,
    train_stage,
)
from crosslip.report import MEAN_COLUMNS, UPPER_COLUMNS, add_diverged, summarize, write_tables

from .helpers import ROOT, dry_run_jobs, fields, random_net, snakemake_cmd

MNIST_MIRROR = ROOT.parent / "shared" / "data" / "mnist"
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
SECONDS = ["certify_seconds", "attack_seconds"]  # wall time: differs between runs
#: Every Snakemake subprocess gets proxies at a closed loopback port: a download attempt
#: fails at once instead of reaching the internet.
OFFLINE = {
    k: "http://127.0.0.1:9" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
}


def offline_env() -> dict[str, str]:
    env = {**os.environ, **OFFLINE}
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    return env


def write_config(work: Path, cfg: dict | str) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "config.yaml"
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg, sort_keys=False))
    return path


def snakemake(
    work: Path, *args: str, config: dict | str | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    if config is not None:
        write_config(work, config)
    return subprocess.run(
        snakemake_cmd(work, *args, configfile=work / "config.yaml"),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=offline_env(),
    )


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def temporaries(folder: Path) -> list[str]:
    """Leftover temporaries of atomic writes (``.<name>.*.tmp``) and downloads (``*.part``)."""
    return [p for p in files_under(folder) if p.endswith((".tmp", ".part"))]


# --------------------------------------------------------------------------------------
# 1. config: rejected before any job runs, naming the key and the allowed values
# --------------------------------------------------------------------------------------

BASE = {
    "datasets": ["mnist5k"],
    "model": {"hidden": 8},
    "train": {
        "epochs": 1,
        "grid": {"none": {"lr": [0.2], "lambda": [0.0]}, "dropout": {"lr": [0.2], "lambda": [0.5]}},
    },
    "certify": {"n_points": 5, "kinds": ["local", "global"]},
    "attack": {"n_points": 5, "norms": ["l2"], "refine_steps": 0},
}
DELETE = object()


def changed(cfg: dict, **changes) -> dict:
    """A deep copy of ``cfg`` with ``a__b__c=value`` set at ``cfg[a][b][c]`` (DELETE: removed)."""
    out = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(last)
        else:
            node[last] = value
    return out


SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
NETS = "allowed keys: " + ", ".join(SCHEMA["$defs"]["net_grid"]["properties"])
TOP = "allowed keys: " + ", ".join(SCHEMA["properties"])
DATASETS = "one of " + ", ".join(SCHEMA["properties"]["datasets"]["items"]["enum"])
MIRRORS = "allowed keys: " + ", ".join(
    SCHEMA["properties"]["data"]["properties"]["mirrors"]["propertyNames"]["enum"]
)
RESULTS = "config key results: not allowed"
#: (id, bad config, substrings the message must hold). Each is a distinct bad input.
BAD_CONFIGS = [
    # unknown keys, at every level
    ("top-level-key", changed(BASE, certfy={"n_points": 3}),
     ["config key certfy: not allowed", TOP, "did you mean certify?"]),
    ("nested-key-regularizer", changed(BASE, train__grid__svm={"lr": [0.1], "lambda": [0.0]}),
     [f"config key train.grid.svm: not allowed; {NETS}"]),
    ("nested-key-model", changed(BASE, model__hiden=8),
     ["config key model.hiden: not allowed", "hidden", "did you mean hidden?"]),
    ("nested-key-grid-spec", changed(BASE, train__grid__none__lambdas=[0.0]),
     ["config key train.grid.none.lambdas: not allowed; allowed keys: lr, lambda"]),
    ("nested-key-certify", changed(BASE, certify__n_point=5),
     ["config key certify.n_point: not allowed", "n_points"]),
    ("unknown-kernel-regularizer", changed(BASE, kernel={"grid": {"kernel_svm": {
        "a": [1.0], "lambda": [0.1]}}}),
     ["config key kernel.grid.kernel_svm: not allowed; allowed keys: kernel_logreg, kernel_cl"]),
    ("unknown-mirror", changed(BASE, data={"mirrors": {"mnist3": "/data"}}),
     [f"config key data.mirrors.mnist3: not allowed; {MIRRORS}"]),
    ("unknown-setting-grid", changed(BASE, train__grid_by_setting={"rotate": {}}),
     ["config key train.grid_by_setting.rotate: not allowed",
      "allowed keys: plain, augment, adversarial"]),
    # wrong types
    ("epochs-string", changed(BASE, train__epochs="ten"),
     ['config key train.epochs: wrong type ("ten"); allowed: an integer >= 1']),
    ("epochs-float", changed(BASE, train__epochs=2.5),
     ["config key train.epochs: wrong type (2.5); allowed: an integer >= 1"]),
    ("epochs-bool", changed(BASE, train__epochs=True),
     ["config key train.epochs: wrong type (true)"]),
    ("datasets-number", changed(BASE, datasets=5),
     ["config key datasets: wrong type (5); allowed: a list", DATASETS]),
    ("datasets-string", changed(BASE, datasets="mnist5k"),
     ['config key datasets: wrong type ("mnist5k")']),
    ("lr-string", changed(BASE, train__grid__none__lr=["fast"]),
     ['config key train.grid.none.lr[0]: wrong type ("fast"); allowed: a number > 0']),
    ("bias-string", changed(BASE, model__bias="yes"),
     ['config key model.bias: wrong type ("yes"); allowed: true or false']),
    ("grid-list", changed(BASE, train__grid=["none"]),
     ["config key train.grid: wrong type", "a mapping with keys among none, weight_decay"]),
    ("mirror-number", changed(BASE, data={"mirrors": {"mnist": 5}}),
     ["config key data.mirrors.mnist: wrong type (5); allowed: a string"]),
    # out of range
    ("epochs-negative", changed(BASE, train__epochs=-3),
     ["config key train.epochs: out of range (-3); allowed: an integer >= 1"]),
    ("epochs-zero", changed(BASE, train__epochs=0),
     ["config key train.epochs: out of range (0)"]),
    ("certify-rtol-zero", changed(BASE, certify__rtol=0),
     ["config key certify.rtol: out of range (0); allowed: a number > 0 and <= 0.5"]),
    ("attack-rtol-large", changed(BASE, attack__rtol=0.9),
     ["config key attack.rtol: out of range (0.9); allowed: a number > 0 and <= 0.5"]),
    ("adv-fraction", changed(BASE, train__adv_fraction=1.5),
     ["config key train.adv_fraction: out of range (1.5); allowed: a number > 0 and <= 1"]),
    ("dropout-probability-1", changed(BASE, train__grid__dropout__lambda=[1.0]),
     ["config key train.grid.dropout.lambda[0]: out of range (1.0); "
      "allowed: a number >= 0 and < 1"]),
    ("lambda-negative", changed(BASE, train__grid__weight_decay={"lr": [0.1], "lambda": [-1e-4]}),
     ["config key train.grid.weight_decay.lambda[0]: out of range (-0.0001)"]),
    ("lr-zero", changed(BASE, train__grid__none__lr=[0.2, 0]),
     ["config key train.grid.none.lr[1]: out of range (0); allowed: a number > 0"]),
    ("hidden-zero", changed(BASE, model__hidden=0), ["config key model.hidden: out of range (0)"]),
    ("n-points-zero", changed(BASE, attack__n_points=0),
     ["config key attack.n_points: out of range (0); allowed: an integer >= 1"]),
    ("seed-negative", changed(BASE, train__seeds=[-1]),
     ["config key train.seeds[0]: out of range (-1); allowed: an integer >= 0"]),
    ("lr-decay-zero", changed(BASE, train__lr_decay=0),
     ["config key train.lr_decay: out of range (0)"]),
    # empty and duplicated lists
    ("lr-empty", changed(BASE, train__grid__none__lr=[]),
     ["config key train.grid.none.lr: empty list ([]); allowed: a list of at least 1 item"]),
    ("lambda-empty", changed(BASE, train__grid__dropout__lambda=[]),
     ["config key train.grid.dropout.lambda: empty list"]),
    ("datasets-empty", changed(BASE, datasets=[]),
     ["config key datasets: empty list ([])", DATASETS]),
    ("kinds-empty", changed(BASE, certify__kinds=[]), ["config key certify.kinds: empty list"]),
    ("seeds-empty", changed(BASE, train__seeds=[]), ["config key train.seeds: empty list"]),
    ("datasets-duplicate", changed(BASE, datasets=["mnist5k", "mnist5k"]),
     ["config key datasets: duplicate items"]),
    # unknown names in lists and enums
    ("unknown-dataset", changed(BASE, datasets=["mnist3"]),
     ['config key datasets[0]: not an allowed value ("mnist3")', DATASETS]),
    ("unknown-setting", changed(BASE, train__settings=["plain", "rotate"]),
     ['config key train.settings[1]: not an allowed value ("rotate"); '
      "allowed: one of plain, augment, adversarial"]),
    ("unknown-attack-norm", changed(BASE, attack__norms=["l3"]),
     ['config key attack.norms[0]: not an allowed value ("l3"); allowed: one of l2, l1, linf']),
    ("unknown-adv-norm", changed(BASE, train__adv_norm="l5"),
     ["config key train.adv_norm: not an allowed value", "one of l1, l2, linf"]),
    ("unknown-kind", changed(BASE, certify__kinds=["local", "l3"]),
     ['config key certify.kinds[1]: not an allowed value ("l3"); '
      "allowed: one of local, global, l2, l1, linf, box"]),
    ("unknown-arch", changed(BASE, model__arch="cnn"),
     ['config key model.arch: not an allowed value ("cnn"); allowed: one of mlp, resnet']),
    ("unknown-device", changed(BASE, device="gpu"), ['config key device: not allowed ("gpu")']),
    # results folders outside the working directory
    ("results-parent", changed(BASE, results="../x"), [RESULTS, '"../x"', "no . or .."]),
    ("results-absolute", changed(BASE, results="/abs"), [RESULTS, '"/abs"']),
    ("results-escaping", changed(BASE, results="a/../../b"), [RESULTS, '"a/../../b"']),
    ("results-dot", changed(BASE, results="."), [RESULTS]),
    ("results-home", changed(BASE, results="~/x"), [RESULTS]),
    ("results-empty", changed(BASE, results=""), [RESULTS]),
    # missing required keys
    ("no-train", changed(BASE, train=DELETE), ["config key train: missing; it is required"]),
    ("no-grid", changed(BASE, train__grid=DELETE),
     ["config key train.grid: missing; it is required: a mapping with keys among none, "]),
    ("no-lambda", changed(BASE, train__grid__none__lambda=DELETE),
     ["config key train.grid.none.lambda: missing; it is required: a list"]),
    # YAML 1.1 reads 1e-3 (no dot) as a string
    ("yaml-exponent-without-dot", yaml.safe_dump(BASE).replace("lr:\n      - 0.2", "lr: [1e-3]"),
     ['config key train.grid.dropout.lr[0]: wrong type ("1e-3")',
      "with a dot and a signed exponent"]),
    ("yaml-exponent-without-sign", yaml.safe_dump(BASE).replace("epochs: 1", "epochs: 1.0e2"),
     ['config key train.epochs: wrong type ("1.0e2")', "1.0e+6"]),
    # consistency checks after the schema (common.smk)
    ("grid-by-setting-absent-setting",
     changed(BASE, train__grid_by_setting={"augment": {"none": {"lr": [0.1], "lambda": [0.0]}}}),
     ["config key train.grid_by_setting", "['augment']", "train.settings ['plain']"]),
    ("trains-no-model", changed(BASE, train__grid={}),
     ["the config trains no model", "train.grid", "kernel.grid"]),
    ("none-with-lambda", changed(BASE, train__grid__none__lambda=[0.1]),
     ["config key train.grid.none.lambda must be [0.0]"]),
]  # fmt: skip
#: Bad configs also run through the command line (stderr, exit status, no results folder).
CLI_CASES = ["nested-key-regularizer", "epochs-negative", "results-parent", "trains-no-model"]


def parse_workflow(work: Path, cfg: dict | str) -> tuple[dict, dict]:
    """Parse the workflow in process for ``cfg`` (as ``snakemake -n`` does before planning):
    returns the validated config (defaults filled in) and the training grid."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    path = write_config(work, cfg)
    with SnakemakeApi(OutputSettings(quiet=True)) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=[path]),
            snakefile=ROOT / "Snakefile",
            workdir=work,
        )._workflow
        return wf.config, wf.globals["GRID"]


def test_base_config_is_valid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, grid = parse_workflow(tmp_path, BASE)
    assert sorted(grid) == ["dropout-lr0.2-lam0.5-seed0", "none-lr0.2-lam0-seed0"]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_rejected_naming_key_and_allowed_values(tmp_path, monkeypatch, case):
    _, cfg, expected = case
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception) as info:  # WorkflowError or ValueError
        parse_workflow(tmp_path, cfg)
    msg = str(info.value)
    for text in expected:
        assert text in msg, f"{text!r} not in:\n{msg}"
    assert "Traceback" not in msg
    assert not (tmp_path / "results").exists()
    assert not (tmp_path.parent / "x").exists() and not Path("/abs").exists()


def test_every_problem_of_a_config_is_listed_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = changed(BASE, certfy={}, train__epochs=-1, datasets=["mnist3"])
    with pytest.raises(Exception, match=r"invalid config \(3 problems") as info:
        parse_workflow(tmp_path, cfg)
    lines = [line for line in str(info.value).splitlines() if line.startswith("config key")]
    assert [line.split(":")[0] for line in lines] == [
        "config key certfy",
        "config key datasets[0]",
        "config key train.epochs",
    ]


def test_defaults_are_filled_in(tmp_path, monkeypatch):
    """The validation fills in the schema's defaults, as snakemake's validate(set_default)."""
    monkeypatch.chdir(tmp_path)
    minimal = {
        "datasets": ["mnist5k"],
        "train": {"grid": {"none": {"lr": [0.1], "lambda": [0]}}},
        "certify": {},
        "attack": {},
    }
    config, grid = parse_workflow(tmp_path, minimal)
    assert config["device"] == "auto" and config["results"] == "results"
    assert config["data"] == {"cache": "results/downloads", "mirrors": {}}
    assert config["model"]["hidden"] == 1024 and config["model"]["arch"] == "mlp"
    assert config["train"]["epochs"] == 10 and config["train"]["settings"] == ["plain"]
    assert config["certify"]["kinds"] == ["local", "global", "l2", "l1", "linf", "box"]
    assert config["attack"]["refine_steps"] == 5 and config["kernel"]["grid"] == {}
    assert list(grid) == ["none-lr0.1-lam0-seed0"] and grid["none-lr0.1-lam0-seed0"]["epochs"] == 10


@pytest.mark.parametrize(
    "preset",
    [
        "config.yaml",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config" / "presets").glob("*.yaml")),
    ],
)
def test_shipped_configs_are_valid(tmp_path, monkeypatch, preset):
    monkeypatch.chdir(tmp_path)
    _, grid = parse_workflow(tmp_path, (ROOT / preset).read_text())
    assert grid


@pytest.mark.slow
def test_bad_config_on_the_command_line_stops_before_any_job(tmp_path):
    cases = {c[0]: c for c in BAD_CONFIGS}
    for name in CLI_CASES:
        _, cfg, expected = cases[name]
        work = tmp_path / name
        proc = snakemake(work, "--cores", "1", config=cfg)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        for text in expected:
            assert text in proc.stderr, (name, text, proc.stderr)
        made = [f for f in files_under(work) if not f.startswith(".snakemake")]  # its own log
        assert made == ["config.yaml"]  # no results/ folder, no output of any job
        assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------------------
# 2. downloads through the workflow: a corrupt mirror file, then the fixed mirror
# --------------------------------------------------------------------------------------
# Covered in tests/test_data.py (fetch_files, MNIST) and tests/test_data_archives.py
# (CIFAR-10, GTSRB): checksum mismatch leaves no file (test_checksum_mismatch_leaves_no_file,
# both files), truncated / interrupted transfer (test_interrupted_transfer_leaves_no_file,
# test_interrupted_transfer_leaves_no_file_and_rerun_succeeds, test_truncated_gzip_in_cache_
# is_replaced, test_corrupt_deflate_download_is_rejected), HTTP error 404
# (test_missing_file_404_message, test_missing_file_404_names_files_folders_and_key), no
# network (test_unreachable_url, test_no_network_names_files_folder_and_key,
# test_mnist_offline_without_mirror_names_every_file), no partial file (files_in(cache) == []
# in each), a corrupt mirror is an error and is left untouched
# (test_mirror_with_wrong_content_raises_and_is_untouched, test_corrupt_mirror_file_raises_
# and_is_kept), rerun after the fix (test_interrupted_transfer_leaves_no_file_and_rerun_
# succeeds, test_corrupt_cache_file_is_replaced). Missing there: the same through the
# workflow, which this section adds.


@pytest.fixture(scope="module")
def mnist_mirror() -> Path:
    if not all((MNIST_MIRROR / name).is_file() for name in MNIST_FILES):
        pytest.skip(f"offline MNIST mirror not found at {MNIST_MIRROR}")
    return MNIST_MIRROR


def corrupt_mirror(folder: Path, good: Path) -> Path:
    """A mirror with the official names: three good files (links) and a test-label file that
    is valid gzip with one label changed (a plausible but wrong copy)."""
    folder.mkdir(parents=True)
    for name in MNIST_FILES[:3]:
        (folder / name).symlink_to(good / name)
    raw = bytearray(gzip.decompress((good / MNIST_FILES[3]).read_bytes()))
    raw[8] = (raw[8] + 1) % 10  # the first test label
    (folder / MNIST_FILES[3]).write_bytes(gzip.compress(bytes(raw)))
    return folder


@pytest.mark.slow
def test_corrupt_mirror_fails_prepare_data_and_fixed_mirror_succeeds(tmp_path, mnist_mirror):
    mirror = corrupt_mirror(tmp_path / "mirror", mnist_mirror)
    bad = mirror / MNIST_FILES[3]
    cfg = changed(BASE, datasets=["mnist"], data={"mirrors": {"mnist": str(mirror)}})
    work = tmp_path / "work"
    target = "results/data/mnist.npz"
    proc = snakemake(work, "--cores", "1", target, config=cfg)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = f"{bad}: checksum mismatch (sha256"
    assert line in proc.stderr and "Error in rule prepare_data" in proc.stderr
    assert line in (work / "results" / "logs" / "prepare_data" / "mnist.log").read_text()
    assert "Traceback" not in proc.stderr  # one clear line, not a traceback
    assert not (work / target).exists()
    assert files_under(work / "results" / "data") == [] and temporaries(work / "results") == []
    assert not (work / "results" / "downloads").exists()  # nothing was downloaded or cached
    assert bad.read_bytes() != (mnist_mirror / MNIST_FILES[3]).read_bytes()  # mirror untouched

    bad.unlink()
    bad.symlink_to(mnist_mirror / MNIST_FILES[3])  # the user fixes the mirror
    proc = snakemake(work, "--cores", "1", target, config=cfg)  # the same command
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ds = load_prepared(work / target)
    assert ds.x_train.shape == (60000, 784) and ds.y_test[:3].tolist() == [7, 2, 1]
    assert temporaries(work / "results") == []


def test_corrupt_mirror_message_names_the_config_key(tmp_path, mnist_mirror):
    mirror = corrupt_mirror(tmp_path / "mirror", mnist_mirror)
    with pytest.raises(ChecksumError) as info:
        load_dataset("mnist", cache_dir=tmp_path / "cache", mirror_dir=mirror)
    assert str(mirror / MNIST_FILES[3]) in str(info.value)
    assert "data.mirrors.mnist" in str(info.value)


# --------------------------------------------------------------------------------------
# 3a. atomic outputs: temporary name, then rename
# --------------------------------------------------------------------------------------


def test_atomic_path_leaves_no_file_and_no_temporary_on_error(tmp_path):
    out = tmp_path / "sub" / "out.parquet"
    with pytest.raises(RuntimeError, match="killed"), atomic_path(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".out.parquet.")
        tmp.write_bytes(b"half of a file")
        raise RuntimeError("killed")
    assert files_under(tmp_path / "sub") == []
    out.write_bytes(b"previous result")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError
    assert out.read_bytes() == b"previous result"  # the old output stays whole
    assert files_under(tmp_path / "sub") == ["out.parquet"]


def test_atomic_path_renames_only_a_finished_file(tmp_path):
    out = tmp_path / "out.txt"
    with atomic_path(out) as tmp:
        tmp.write_text("part 1 ")
        assert not out.exists()  # invisible under its final name while being written
        with open(tmp, "a") as fh:
            fh.write("part 2")
    assert out.read_text() == "part 1 part 2" and files_under(tmp_path) == ["out.txt"]


class Killed(BaseException):
    """Stands for SIGKILL arriving just before a rename (BaseException: nothing catches it)."""


@pytest.fixture
def stage_inputs(tmp_path):
    """A toy dataset, a trained-looking net and its metrics, as a workflow would have them."""
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(40, 6)) / 255).astype(np.float32)
    y = rng.integers(0, 3, size=40).astype(np.int64)
    save_prepared(Dataset("toy", x[:30], y[:30], x[30:], y[30:], (6,), 3), tmp_path / "toy.npz")
    save_model(random_net(6, 3, 8, 0, 4.0).float(), tmp_path / "model.pt")
    metrics = {
        "status": "ok",
        "dataset": "toy",
        "model_id": "m",
        "test_error": 0.5,
        "config": {"regularizer": "none", "lr": 0.1, "lam": 0.0, "seed": 0},
    }
    write_json(metrics, tmp_path / "metrics.json")
    return tmp_path


def _stage_writers(d: Path):
    """name -> (function writing outputs, its outputs in the order written)."""
    train = {"regularizer": "none", "lr": 0.1, "lam": 0.0, "epochs": 1, "hidden": 4}
    inputs = (d / "toy.npz", d / "model.pt", d / "metrics.json")
    kw = {"n_points": 4, "rtol": 1e-2}
    summary = pd.DataFrame({"a": [1.0]})
    return {
        "prepare_data": (
            lambda: pipeline.prepare_data("mnist5k", d / "o" / "data.npz", str(d / "cache"), None),
            ["data.npz"],
        ),
        "train": (
            lambda: train_stage(
                d / "toy.npz", train, "m", d / "o" / "model.pt", d / "o" / "metrics.json"
            ),
            ["model.pt", "metrics.json"],
        ),
        "certify": (lambda: certify_stage(*inputs, d / "o" / "c.parquet", **kw), ["c.parquet"]),
        "attack": (
            lambda: attack_stage(
                *inputs,
                d / "o" / "a.parquet",
                max_steps=5,
                norms=("l2",),
                refine_steps=0,
                examples_out=d / "o" / "ex.npz",
                **kw,
            ),
            ["a.parquet", "ex.npz"],
        ),
        "tables": (
            lambda: write_tables(summary, d / "o" / "t.csv", d / "o" / "t.md", d / "o" / "t.tex"),
            ["t.csv", "t.md", "t.tex"],
        ),
    }


@pytest.mark.parametrize("stage", ["prepare_data", "train", "certify", "attack", "tables"])
def test_every_stage_output_appears_only_by_rename(stage_inputs, monkeypatch, stage):
    """Kill each stage just before each of its renames: the output being written is absent
    under its final name (a writer that wrote the final name directly would leave it there,
    half-written, and never reach a rename); the outputs renamed before are whole."""
    d = stage_inputs
    write, outputs = _stage_writers(d)[stage]
    real_replace = os.replace
    for n in range(len(outputs)):
        shutil.rmtree(d / "o", ignore_errors=True)
        calls = []

        def replace(src, dst, n=n, calls=calls):
            if len(calls) == n:
                raise Killed(dst)
            calls.append(dst)
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        with pytest.raises(Killed):
            write()
        monkeypatch.setattr(os, "replace", real_replace)
        assert [Path(c).name for c in calls] == outputs[:n]
        assert files_under(d / "o") == sorted(outputs[:n])  # no partial output, no temporary


# --------------------------------------------------------------------------------------
# 3b. interruptions: SIGKILL, then the same command
# --------------------------------------------------------------------------------------

#: One sweep for the load test (section 6) and, as the uninterrupted reference, for the
#: interruption test: 12 models (one diverges: weight decay 1 at lr 1000), 1000 certified
#: points each (the whole mnist5k test split), 5 attacked points. Jobs take a few tenths of
#: a second of computation on an idle 2-core machine (slow enough that a kill lands while
#: one computes) after a few seconds of Python start-up.
SWEEP = {
    "datasets": ["mnist5k"],
    "model": {"hidden": 32},
    "train": {
        "epochs": 6,
        "grid": {
            "none": {"lr": [0.1, 0.2], "lambda": [0.0]},
            "weight_decay": {"lr": [0.2, 1000.0], "lambda": [1.0e-4, 1.0]},
            "dropout": {"lr": [0.1, 0.2], "lambda": [0.5]},
            "cross_lipschitz": {"lr": [0.1, 0.2], "lambda": [1.0e-3, 1.0e-2]},
        },
    },
    "certify": {"n_points": 1000, "kinds": ["local", "global"]},
    "attack": {"n_points": 5, "norms": ["l2"], "refine_steps": 0, "n_examples": 1},
}
DIVERGED = "weight_decay-lr1000-lam1-seed0"
#: One thread per job: two jobs run at once on the 2 cores (and every run of a model uses
#: the same number of threads, so that its floating-point results are reproducible). Last
#: on a command line: --set-threads takes every argument after it.
THREADS = ["--set-threads", "train=1", "certify=1", "attack=1"]
#: The interruption test's config: two models of the sweep, everything else the same.
INTERRUPT = changed(
    SWEEP,
    train__grid={
        "none": {"lr": [0.2], "lambda": [0.0]},
        "cross_lipschitz": {"lr": [0.2], "lambda": [1.0e-3]},
    },
)
MODELS = ["cross_lipschitz-lr0.2-lam0.001-seed0", "none-lr0.2-lam0-seed0"]
TARGETS = [f"results/instances/mnist5k/{m}.parquet" for m in MODELS]


def job_outputs(rule: str, wildcards: dict[str, str]) -> list[str]:
    """The outputs of a job of workflow/rules/*.smk (results folder: ``results``)."""
    ds, m = wildcards.get("dataset"), wildcards.get("model")
    return {
        "prepare_data": [f"results/data/{ds}.npz"],
        "train": [f"results/models/{ds}/{m}/model.pt", f"results/models/{ds}/{m}/metrics.json"],
        "certify": [f"results/certify/{ds}/{m}.parquet"],
        "attack": [f"results/attack/{ds}/{m}.parquet", f"results/examples/{ds}/{m}.npz"],
        "instances": [f"results/instances/{ds}/{m}.parquet"],
    }[rule]


def planned_jobs(output: str) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run (``-n``) lists."""
    return {(job["rule"], job["wildcards"]) for job in dry_run_jobs(output)}


def marked_incomplete(work: Path) -> set[str]:
    """Outputs that Snakemake marked incomplete: it marks a job's outputs when the job starts
    and unmarks them when it has finished (Snakemake 9 keeps one file per output in
    .snakemake/incomplete, named by the url-safe base64 of its path)."""
    folder = work / ".snakemake" / "incomplete"
    marks = [p.name for p in folder.iterdir() if p.is_file()] if folder.exists() else []
    return {base64.urlsafe_b64decode(m).decode() for m in marks if m != "migration_underway"}


def unfinished(work: Path, plan: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Jobs of ``plan`` that have not finished: an output is missing, or exists but its job
    was killed before Snakemake saw it finish (a job killed after its last rename)."""
    incomplete = marked_incomplete(work)
    return {
        job
        for job in plan
        if any(
            not (work / o).is_file() or o in incomplete for o in job_outputs(job[0], fields(job[1]))
        )
    }


def finished_rules(output: str) -> Counter:
    return Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", output))


#: The command of the interruption test: the default run with --rerun-incomplete, as the
#: profiles set it (redo a job whose outputs exist but that was killed before it finished;
#: safe because every output is renamed into place complete).
RUN = ["--cores", "2", "--rerun-incomplete", *TARGETS, *THREADS]


def dry_run(work: Path, *extra: str) -> subprocess.CompletedProcess:
    """What the run command would do now."""
    return snakemake(work, "-n", "--rerun-incomplete", *extra, *TARGETS)


def plan_now(work: Path) -> set[tuple[str, str]]:
    """The jobs the run command would run now (its dry run must succeed)."""
    proc = dry_run(work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return planned_jobs(proc.stdout)


def start(work: Path) -> subprocess.Popen:
    """The run command, in its own process group (as a terminal or a batch system would)."""
    return subprocess.Popen(
        snakemake_cmd(work, *RUN, configfile=work / "config.yaml"),
        env=offline_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_job(proc: subprocess.Popen, rule: str) -> tuple[str, psutil.Process]:
    """Wait until a ``rule`` job computes: its script has opened its log file (right before
    its main function); returns the job's model and its process."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"finished before a {rule} job ran:\n{proc.stdout.read()}"
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if not any(a.endswith(f".{rule}.py") for a in child.cmdline()):
                    continue
                logs = [Path(f.path) for f in child.open_files() if f.path.endswith(".log")]
            except psutil.NoSuchProcess:
                continue
            if logs:
                time.sleep(0.1)  # into the computation
                return logs[0].stem, child
        time.sleep(0.01)
    raise AssertionError(f"no {rule} job started")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to Snakemake and all its jobs at once (a killed terminal, node, allocation)."""
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    psutil.wait_procs(family, timeout=30)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)


def instances(work: Path) -> dict[str, pd.DataFrame]:
    folder = work / "results" / "instances" / "mnist5k"
    return {p.stem: pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))}


def mtimes(work: Path) -> dict[str, int]:
    return {
        str(p.relative_to(work)): p.stat().st_mtime_ns
        for p in (work / "results").rglob("*")
        if p.is_file() and p.parts[len(work.parts) + 1] not in ("logs", "benchmarks")
    }


@pytest.mark.slow
def test_killed_runs_resume_with_the_same_command_and_equal_an_uninterrupted_run(
    tmp_path, load_run
):
    """The reference is the uninterrupted sweep of section 6: the same jobs (same
    parameters, data, threads) for these two models."""
    reference = load_run[0]
    work = tmp_path / "work"
    plan = planned_jobs(snakemake(work, "-n", *TARGETS, config=INTERRUPT).stdout)
    assert len(plan) == 9  # prepare_data, 2 x (train, certify, attack, instances)
    interruptions = 0

    # (a) SIGKILL to Snakemake and its jobs while a model trains.
    proc = start(work)
    model, _ = wait_for_job(proc, "train")
    kill_group(proc)
    interruptions += 1
    assert not (work / f"results/models/mnist5k/{model}/model.pt").exists()  # killed mid-way
    assert not (work / f"results/models/mnist5k/{model}/metrics.json").exists()
    # (a kill during a write would leave a hidden temporary, never a file under its final
    # name; the kill lands in a computation here, so normally there is none)
    leftovers = set(temporaries(work / "results"))
    # Snakemake's lock files outlive a SIGKILL; the run lock does not (crosslip.runlock), so
    # the same command needs no --unlock (the run itself: tests/test_resume.py).
    todo = plan_now(work)
    assert todo == unfinished(work, plan) and ("train", f"dataset=mnist5k, model={model}") in todo
    assert ("prepare_data", "dataset=mnist5k") not in todo  # finished before: kept

    # A kill between the two renames of a training job (model.pt written, metrics.json not)
    # leaves a file that Snakemake marked incomplete: without --rerun-incomplete (which
    # profiles/default sets for every command) it stops.
    half = work / f"results/models/mnist5k/{model}/model.pt"
    half.parent.mkdir(parents=True, exist_ok=True)
    half.write_bytes(b"written before the kill")
    stopped = snakemake(work, "-n", "--workflow-profile", "none", *TARGETS)
    assert stopped.returncode == 1
    assert "IncompleteFilesException" in stopped.stdout + stopped.stderr
    assert "--rerun-incomplete" in stopped.stdout + stopped.stderr
    assert plan_now(work) == todo  # with it, the job is redone
    half.unlink()

    # (b) The scheduler kills a certification job (SIGKILL to its process only).
    proc = start(work)
    model, job = wait_for_job(proc, "certify")
    job.kill()
    out = proc.communicate(timeout=600)[0]
    interruptions += 1
    assert proc.returncode == 1 and "Error in rule certify" in out, out
    assert not (work / f"results/certify/mnist5k/{model}.parquet").exists()
    leftovers |= set(temporaries(work / "results"))
    todo = plan_now(work)  # no lock left: Snakemake itself was not killed
    assert todo == unfinished(work, plan) and ("certify", f"dataset=mnist5k, model={model}") in todo
    assert ("train", f"dataset=mnist5k, model={model}") not in todo

    # (c) Ctrl-C in the terminal (SIGINT to Snakemake and its jobs) during a certification:
    # Snakemake stops the jobs and releases its lock.
    proc = start(work)
    model, _ = wait_for_job(proc, "certify")
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=600)[0]
    interruptions += 1
    assert proc.returncode == 1, out
    assert not (work / f"results/certify/mnist5k/{model}.parquet").exists()
    leftovers |= set(temporaries(work / "results"))
    todo = plan_now(work)
    assert todo == unfinished(work, plan) and ("certify", f"dataset=mnist5k, model={model}") in todo

    # (d) A batch system ends the allocation (scancel, time limit: SIGTERM to Snakemake and
    # its jobs, SIGKILL after a grace period) during a certification.
    proc = start(work)
    model, _ = wait_for_job(proc, "certify")
    os.killpg(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=600)[0]
    interruptions += 1
    # The jobs die of the signal; Snakemake reports them failed, exits 1 and releases its
    # lock (unlike after a SIGKILL), so the same command can simply run again.
    assert proc.returncode == 1 and "died with <Signals.SIGTERM" in out, out
    assert "Error in rule certify" in out
    assert not (work / f"results/certify/mnist5k/{model}.parquet").exists()
    leftovers |= set(temporaries(work / "results"))
    todo = plan_now(work)
    assert todo == unfinished(work, plan) and ("certify", f"dataset=mnist5k, model={model}") in todo
    kept = {k: v for k, v in mtimes(work).items() if k not in marked_incomplete(work)}

    # The same command again: exactly the unfinished jobs run, nothing finished is redone.
    proc = snakemake(work, *RUN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert finished_rules(proc.stdout + proc.stderr) == Counter(r for r, _ in todo)
    assert {k: v for k, v in mtimes(work).items() if k in kept} == kept
    done = dry_run(work)
    assert "Nothing to be done" in done.stdout + done.stderr

    # The results equal the uninterrupted run's (wall times aside), row for row.
    got, want = instances(work), instances(reference)
    assert sorted(got) == MODELS and set(MODELS) <= set(want)
    lost = 0
    for m in MODELS:
        lost += len(want[m]) - len(got[m])
        pd.testing.assert_frame_equal(
            got[m].drop(columns=SECONDS), want[m].drop(columns=SECONDS), check_exact=True
        )
        a = read_json(work / f"results/models/mnist5k/{m}/metrics.json")
        b = read_json(reference / f"results/models/mnist5k/{m}/metrics.json")
        a.pop("seconds"), b.pop("seconds")
        assert a == b
    assert lost == 0 and interruptions == 4
    assert set(temporaries(work / "results")) <= leftovers  # no run leaves a temporary


# --------------------------------------------------------------------------------------
# 4. numerics: ties, misclassified points, constant models, failed attacks
# --------------------------------------------------------------------------------------
# Existing: tests/test_certify.py::test_zero_margin_and_constant_model (Theorem 2.1's search
# alone), tests/test_train.py::test_diverging_run_is_recorded (train()),
# tests/test_stages.py::test_diverged_model_has_no_instances_but_keeps_its_summary_row (the
# stages). Here: certify_softplus and the stages on such models, and a sweep (section 6).


def tie_net() -> SoftplusNet:
    """Classes 0 and 1 have identical output rows: a tie (zero margin) at every point."""
    net = random_net(6, 3, 8, 0, 4.0)
    with torch.no_grad():
        net.output_layer.weight[1] = net.output_layer.weight[0]
        net.output_layer.bias[1] = net.output_layer.bias[0]
        net.output_layer.bias[2] = -100.0  # class 2 never wins
    return net


def constant_net(bias: tuple[float, ...]) -> SoftplusNet:
    """All weights zero: the output is ``bias`` everywhere (zeros: a three-way tie)."""
    net = SoftplusNet(6, 3, hidden=8).double()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.output_layer.bias.copy_(torch.tensor(bias, dtype=torch.float64))
    return net.eval()


def points(n: int = 7) -> torch.Tensor:
    return torch.rand(n, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


GUARANTEES = [c for c in MEAN_COLUMNS if c.startswith("guarantee")]


@pytest.mark.parametrize("name", ["tie", "all-zero", "constant-output"])
def test_zero_margin_and_constant_models_get_defined_guarantees(name):
    """Zero margin (a tie, or a net whose weights are all zero): every guarantee is 0 and no
    class attains it (bound_class -1). A net whose output does not depend on the input but
    has a winner: every guarantee is +inf (no perturbation changes the decision)."""
    net = {
        "tie": tie_net,
        "all-zero": lambda: constant_net((0.0, 0.0, 0.0)),
        "constant-output": lambda: constant_net((1.0, 0.0, -1.0)),
    }[name]()
    res = certify_softplus(net, points())
    assert res["pred"].eq(0).all()  # the lower index wins a tie
    for col in GUARANTEES:
        g = res[col]
        assert not g.isnan().any(), col
        assert (g == (math.inf if name == "constant-output" else 0.0)).all(), (col, g)
    if name != "constant-output":
        assert res["margin"].eq(0).all() and res["bound_class"].eq(-1).all()


def test_constant_model_bound_class_is_not_the_predicted_class():
    res = certify_softplus(constant_net((1.0, 0.0, -1.0)), points())
    assert (res["bound_class"] != res["pred"]).all()


@pytest.mark.parametrize("gap", [1e-6, 1e-9, 1e-13])
def test_tiny_margin_gives_a_tiny_positive_finite_guarantee(gap):
    net = random_net(6, 3, 8, 1, 4.0)
    x = points(1)
    with torch.no_grad():  # lift the runner-up to within ``gap`` of the winner at x
        logits = net(x)[0]
        c, j = logits.argsort(descending=True)[:2].tolist()
        net.output_layer.bias[j] += logits[c] - logits[j] - gap
    res = certify_softplus(net, x)
    assert res["pred"].item() == c and 0 < res["margin"].item() < 2 * gap
    for col in GUARANTEES:
        g = res[col].item()
        assert 0 < g < 1e3 * gap, (col, g)  # tiny, positive, finite
    ub = upper_bound(net, x, p=2)
    assert ub.success.item() and ub.norm.item() >= res["guarantee_l2"].item()


def toy_inputs(tmp_path: Path, y: np.ndarray, cfg: dict, test_error: float) -> np.ndarray:
    """A 6-pixel, 3-class prepared dataset (10 train, 10 test points with labels ``y``) and
    a metrics file in ``tmp_path``; returns all 20 points."""
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(20, 6)) / 255).astype(np.float32)
    save_prepared(Dataset("toy", x[:10], y[:10], x[10:], y[10:], (6,), 3), tmp_path / "toy.npz")
    write_json(
        {"status": "ok", "dataset": "toy", "model_id": "m", "test_error": test_error,
         "config": cfg},
        tmp_path / "metrics.json",
    )  # fmt: skip
    return x


def run_stages(tmp_path: Path, name: str, model: torch.nn.Module) -> pd.DataFrame:
    """``model`` through certify_stage, attack_stage and instances_stage on the toy data
    (10 points); returns the instances, whose file must have the instance schema."""
    d = tmp_path / name
    save_model(model, d / "model.pt")
    args = (tmp_path / "toy.npz", d / "model.pt", tmp_path / "metrics.json")
    certify_stage(*args, d / "c.parquet", n_points=10, rtol=1e-3)
    attack_stage(*args, d / "a.parquet", n_points=10, rtol=1e-3, max_steps=20)
    df = instances_stage(
        d / "c.parquet", d / "a.parquet", tmp_path / "metrics.json", name, d / "i.parquet"
    )
    assert pq.read_table(d / "i.parquet").schema.equals(INSTANCE_SCHEMA, check_metadata=False)
    assert len(df) == 10
    return df


def test_stages_on_degenerate_models_write_defined_values(tmp_path):
    """Through certify_stage / attack_stage / instances_stage: a tie model, a constant model,
    misclassified points. Rows are kept; guarantees are finite or +inf, never NaN; failed
    attacks are rows with attack_success False and a null upper bound."""
    y = np.array([2] * 20, dtype=np.int64)  # every model predicts 0 or 1: all misclassified
    toy_inputs(tmp_path, y, {"regularizer": "none", "lr": 0.1, "lam": 0.0, "seed": 0}, 1.0)
    frames = {}
    for name, net in (
        ("tie", tie_net()),
        ("constant", constant_net((1.0, 0.0, -1.0))),
        ("zero", constant_net((0.0, 0.0, 0.0))),
    ):
        df = run_stages(tmp_path, name, net)
        assert not df["correct"].any()  # misclassified points are kept
        for col in [c for c in GUARANTEE_COLUMNS if c != "bound_class"]:
            assert df[col].notna().all(), (name, col)
        frames[name] = df
    assert (frames["tie"][GUARANTEES] == 0).all().all()
    assert (frames["zero"][GUARANTEES] == 0).all().all()
    assert np.isinf(frames["constant"][GUARANTEES].to_numpy()).all()
    failed = frames["constant"]  # nothing moves a constant model's decision
    assert not failed["attack_success"].any() and failed["upper_bound"].isna().all()
    assert (failed["adv_class"] == -1).all() and failed["upper_bound_l1"].isna().all()
    for df in frames.values():  # any attack that succeeded is a finite bound above the guarantee
        ok = df["attack_success"]
        assert np.isfinite(df.loc[ok, "upper_bound"]).all()
        assert (df.loc[ok, "upper_bound"] >= df.loc[ok, "guarantee_l2"]).all()
        assert df.loc[~ok, "upper_bound"].isna().all()


def kernel_model(kind: str, x: np.ndarray) -> GaussianKernelModel:
    """Degenerate Gaussian-kernel models on the centres ``x`` (3 classes): ``zero`` (the
    untrained model: a three-way tie everywhere), ``tie`` (classes 0 and 1 share their
    coefficients, class 2 is below both), ``underflow`` (a width so small that every kernel
    value away from the centres is exactly 0: a tie wherever the points are not centres),
    ``near`` (class 1's coefficients are class 0's lowered by 1e-6: tiny positive margins,
    yet class 0 wins everywhere)."""
    centers = torch.as_tensor(x, dtype=torch.float64)
    model = GaussianKernelModel(centers, 3, 1e6 if kind == "underflow" else 2.0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if kind != "zero":
            model.coef.copy_(torch.randn(3, len(x), generator=g, dtype=torch.float64))
            model.coef[1] = model.coef[0] - (1e-6 if kind == "near" else 0.0)
            model.coef[2] = model.coef[0] - 1.0  # f_2 < f_0 everywhere
    return model.eval()


def test_kernel_stages_on_degenerate_models_write_defined_values(tmp_path):
    """The kernel model through certify_stage / attack_stage / instances_stage: guarantees are
    0 with no bound class at a tie, finite and positive otherwise, never NaN; a tie's failed
    attack (no perturbation changes an argmax that a tie resolves to the lower index) is a row
    with a null upper bound; every successful attack lies outside the certified ball."""
    y = np.array([0, 1] * 10, dtype=np.int64)
    cfg = {"regularizer": "kernel_cl", "lr": None, "lam": 0.1, "seed": 0}
    x = toy_inputs(tmp_path, y, cfg, 0.5)
    frames = {}
    for kind in ("zero", "tie", "underflow", "near"):
        df = run_stages(tmp_path, kind, kernel_model(kind, x[:10]))
        assert (df["family"] == "kernel").all()
        for col in ("margin", "guarantee_local", "guarantee_l2", "radius_local"):
            assert df[col].notna().all() and (df[col] >= 0).all(), (kind, col)
        ok = df["attack_success"]
        assert (df.loc[ok, "upper_bound"] >= df.loc[ok, "guarantee_l2"]).all(), kind
        assert df.loc[~ok, "upper_bound"].isna().all() and (df.loc[~ok, "adv_class"] == -1).all()
        frames[kind] = df
    for kind in ("zero", "tie", "underflow"):
        df = frames[kind]
        assert (df["pred"] == 0).all() and (df["margin"] == 0).all(), kind
        assert (df["guarantee_l2"] == 0).all() and (df["bound_class"] == -1).all(), kind
    assert not frames["zero"]["attack_success"].any()  # a constant function: nothing moves it
    near = frames["near"]
    assert (
        (near["pred"] == 0).all() and (near["margin"] > 0).all() and (near["margin"] < 1e-4).all()
    )
    assert np.isfinite(near["guarantee_l2"]).all() and (near["guarantee_l2"] > 0).all()
    # class 1's margin is tiny but so is its gradient difference (both scale with the 1e-6
    # gap), so the guarantee need not be tiny and class 2 may attain it; since
    # f_0 - f_1 = 1e-6 sum_r k(x, x_r) > 0 everywhere, no attack can succeed either
    assert near["bound_class"].isin([1, 2]).all() and not near["attack_success"].any()


def test_failed_attacks_count_in_the_success_rate_not_in_the_mean():
    """summarize: means over the correctly classified points; attack_success_rate counts the
    failed attacks; mean_upper_bound averages the successful ones only."""
    n = 6
    df = pd.DataFrame(
        {
            "dataset": "toy",
            "model_id": "m",
            "family": "mlp",
            "regularizer": "none",
            "lr": 0.1,
            "lam": 0.0,
            "kernel_a": np.nan,
            "seed": 0,
            "setting": "plain",
            "status": "ok",
            "test_error": 0.5,
            "test_index": range(n),
            "correct": [True, True, True, True, False, False],
            "attack_success": [True, True, False, False, True, False],
            "upper_bound": [1.0, 3.0, np.nan, np.nan, 100.0, np.nan],
            "guarantee_local": [0.5, 1.0, 2.0, 0.0, 9.0, 9.0],
        }
    )
    for col in {*MEAN_COLUMNS, *UPPER_COLUMNS} - {"guarantee_local"}:
        df[col] = np.nan
    row = summarize(df).iloc[0]
    assert row["n_eval"] == 6 and row["n_correct"] == 4
    assert row["attack_success_rate"] == 0.5  # 2 of the 4 correct points; failures count
    assert row["mean_upper_bound"] == 2.0  # (1 + 3) / 2: successes only, misclassified out
    assert row["mean_guarantee_local"] == 0.875  # includes the 0 guarantee


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


# --------------------------------------------------------------------------------------
# 6. load: > 50 jobs on 2 cores, no lost or duplicated rows; a diverging model in the sweep
# --------------------------------------------------------------------------------------

OUTPUT_DIRS = ("data", "models", "certify", "attack", "examples", "instances", "tables")


def read_output(path: Path) -> None:
    """Read a workflow output completely; raises on a half-written file."""
    if path.suffix == ".parquet":
        pq.read_table(path)
    elif path.suffix == ".json":
        json.loads(path.read_text())
    elif path.suffix == ".pt":
        load_model(path)
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            for k in z.files:
                z[k]
    elif path.suffix == ".csv":
        pd.read_csv(path)


class Watcher(threading.Thread):
    """Reads every output the moment it appears under its final name, while the workflow
    runs: a half-written output would fail to parse."""

    def __init__(self, results: Path):
        super().__init__(daemon=True)
        self.results, self.seen, self.broken = results, set(), []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.scan()
            time.sleep(0.02)
        self.scan()

    def scan(self) -> None:
        for sub in OUTPUT_DIRS:
            for p in (self.results / sub).rglob("*") if (self.results / sub).exists() else []:
                if p.name.startswith(".") or not p.is_file() or p in self.seen:
                    continue
                self.seen.add(p)
                try:
                    read_output(p)
                except Exception as exc:  # any parse error is the finding
                    self.broken.append(f"{p}: {exc!r}")


@pytest.fixture(scope="module")
def load_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("load")
    plan = snakemake(work, "-n", config=SWEEP)
    assert plan.returncode == 0, plan.stderr
    watcher = Watcher(work / "results")
    watcher.start()
    t0 = time.monotonic()
    proc = snakemake(work, "--cores", "2", *THREADS)
    seconds = time.monotonic() - t0
    watcher.stop.set()
    watcher.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (
        work,
        planned_jobs(plan.stdout),
        finished_rules(proc.stdout + proc.stderr),
        watcher,
        seconds,
    )


@pytest.mark.slow
def test_many_jobs_on_two_cores_lose_and_duplicate_no_row(load_run):
    work, plan, ran, watcher, _ = load_run
    models = sorted({fields(wc)["model"] for rule, wc in plan if rule == "train"})
    assert len(models) == 12 and sum(ran.values()) == len(plan) >= 50
    assert ran["train"] == ran["certify"] == ran["attack"] == ran["instances"] == 12
    df = pd.read_parquet(work / "results" / "instances")
    ok = [m for m in models if m != DIVERGED]
    expected = {(m, i) for m in ok for i in range(1000)}  # n_points 1000: all test points
    got = list(zip(df["model_id"], df["test_index"], strict=True))
    assert len(got) == len(set(got)) == len(ok) * 1000  # no duplicate
    assert set(got) == expected  # none missing, none extra
    attacked = df[df["attack_success"].notna()].groupby("model_id")["test_index"].nunique()
    assert (attacked == 5).all() and sorted(attacked.index) == ok  # attack.n_points each
    assert len(expected) - len(set(got) & expected) == 0  # rows lost
    assert sorted(p.stem for p in (work / "results/instances/mnist5k").glob("*.parquet")) == models
    assert watcher.seen and watcher.broken == []  # no output was ever visible half-written
    assert temporaries(work / "results") == []  # and no temporary was left behind


@pytest.mark.slow
def test_a_diverging_model_is_recorded_and_the_sweep_continues(load_run):
    work, *_ = load_run
    res = work / "results"
    met = read_json(res / "models" / "mnist5k" / DIVERGED / "metrics.json")
    assert met["status"] == "diverged" and met["test_error"] is None
    load_model(res / "models" / "mnist5k" / DIVERGED / "model.pt")  # still a valid file
    assert pd.read_parquet(res / "instances" / "mnist5k" / f"{DIVERGED}.parquet").empty
    summary = pd.read_csv(res / "tables" / "summary.csv").set_index("model_id")
    assert len(summary) == 12
    assert summary.loc[DIVERGED, "status"] == "diverged" and summary.loc[DIVERGED, "n_eval"] == 0
    others = summary.drop(index=DIVERGED)
    assert (others["status"] == "ok").all() and (others["n_eval"] == 1000).all()
    assert others["test_error"].between(0, 1).all()
    assert (res / "tables" / "table1_global_local.csv").exists()
    assert (res / "figures" / "adversarial_samples.png").exists()
    # the summary agrees with the per-instance rows it was made from
    df = pd.read_parquet(res / "instances")
    again = add_diverged(
        summarize(df), [read_json(p) for p in sorted((res / "models").rglob("metrics.json"))]
    )
    assert sorted(again["model_id"]) == sorted(summary.index)


@pytest.mark.slow
def test_a_grid_value_of_a_million_or_more_gives_a_runnable_model(tmp_path):
    proc = snakemake(tmp_path, "-n", config=changed(BASE, train__grid__none__lr=[1.0e6]))
    assert proc.returncode == 0, proc.stderr
    assert "none-lr1e+06-lam0-seed0" in proc.stdout

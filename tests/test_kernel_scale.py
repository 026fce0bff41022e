"""Kernel models at the paper's scale: the memory estimate stops a config that cannot fit
before any job runs, job resources follow from the config, and the chunked kernel stages give
the same results on CUDA as on the CPU."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import yaml

from crosslip.certify.kernel_bounds import certify_kernel
from crosslip.certify.kernel_bounds import plan_for as certify_plan_for
from crosslip.config.grid import training_grid
from crosslip.config.specs import NetTrainSpec
from crosslip.config.validate import validate
from crosslip.errors import ConfigError
from crosslip.jobs.resources import job_resources
from crosslip.kernel_memory import (
    BYTES,
    DATASET_SHAPES,
    GIB,
    certify_minimum_bytes,
    check_config,
    config_problems,
    largest_centers,
    train_minimum_bytes,
    train_plan,
)
from crosslip.training.kernel import KernelTrainConfig, plan_for, train_kernel

from .helpers import ROOT, dry_run_jobs, fields, run_snakemake, snakemake_cmd, toy_dataset

PRESET = yaml.safe_load((ROOT / "config" / "presets" / "mnist_kernel.yaml").read_text())


def checked(cfg: dict) -> dict:
    """``cfg`` validated and its kernel models' memory checked, as the Snakefile does."""
    cfg = validate(cfg)
    check_config(cfg)
    return cfg


def preset(**kernel) -> dict:
    cfg = copy.deepcopy(PRESET)
    cfg["kernel"].update(kernel)
    return cfg


# ---------------------------------------------------------------------------------------------
# The memory estimate, before any job


def test_the_paper_scale_is_rejected_in_the_default_budget_naming_keys_and_estimate():
    cfg = preset()
    del cfg["kernel"]["memory_gb"]  # the schema's default: 16 GiB
    with pytest.raises(ConfigError) as info:
        checked(cfg)
    msg = str(info.value)
    # 60,000 centres: the (N, N) float64 matrix alone is 26.8 GiB; device auto plans for a
    # GPU (its cuBLAS workspaces and allocator slack: kernel_memory.device_reserve_bytes)
    need_cl = train_minimum_bytes(60000, 60000, 784, 10, "kernel_cl", "cuda")
    need_lr = train_minimum_bytes(60000, 60000, 784, 10, "kernel_logreg", "cuda")
    assert need_lr > BYTES * 60000**2 > 16 * GIB
    for key in ("kernel.n_centers (0: 60,000", "kernel.memory_gb (16)", "datasets (mnist)"):
        assert key in msg, msg
    for reg, need in (("kernel_cl", need_cl), ("kernel_logreg", need_lr)):
        shown = math.ceil(need / GIB * 10) / 10  # rounded up: the budget must reach it
        assert f"{reg} needs at least {shown:.1f} GiB" in msg, msg
        assert f"raise kernel.memory_gb to at least {shown:.1f} on" in msg, msg
    fit = largest_centers(60000, 784, 10, "kernel_cl", 16 * GIB, "cuda")
    assert f"kernel.n_centers to at most {fit:,}" in msg
    # that advice is right: one more centre does not fit, that many do
    assert train_minimum_bytes(60000, fit, 784, 10, "kernel_cl", "cuda") <= 16 * GIB
    assert train_minimum_bytes(60000, fit + 1, 784, 10, "kernel_cl", "cuda") > 16 * GIB
    # on the CPU, without the GPU's reserve, a few more fit
    on_cpu = {**preset(), "device": "cpu"}
    del on_cpu["kernel"]["memory_gb"]
    with pytest.raises(ConfigError, match=r"kernel_cl needs at least") as info:
        checked(on_cpu)
    assert largest_centers(60000, 784, 10, "kernel_cl", 16 * GIB, "cpu") > fit
    shown = math.ceil(train_minimum_bytes(60000, 60000, 784, 10, "kernel_cl") / GIB * 10) / 10
    assert f"kernel_cl needs at least {shown:.1f} GiB" in str(info.value)
    ok = preset(memory_gb=16, n_centers=fit)
    ok["kernel"]["grid"] = {"kernel_cl": ok["kernel"]["grid"]["kernel_cl"]}
    checked(ok)
    checked(preset())  # the preset as committed: 70 GiB of one 80 GB GPU


def test_the_estimate_counts_each_dataset_and_regularizer():
    cfg = validate(preset(n_centers=30000, memory_gb=8.5))  # 6.7 GiB per matrix: fits mnist
    assert config_problems(cfg) == []
    cfg = preset(n_centers=30000, memory_gb=8.5)
    cfg["datasets"] = ["mnist", "cifar10", "mnist5k"]
    with pytest.raises(ConfigError) as info:
        checked(cfg)
    lines = str(info.value).splitlines()[1:]
    # cifar10 (d = 3072) does not fit with either regularizer; mnist does; mnist5k has 4,000
    assert len(lines) == 2 and all("datasets (cifar10)" in line for line in lines), lines
    assert DATASET_SHAPES["mnist5k"].n_train == 4000
    cfg = preset(memory_gb=1e-3)
    cfg["datasets"] = ["mnist5k"]
    with pytest.raises(ConfigError, match=r"4,000 expansion points on mnist5k"):
        checked(cfg)
    net_only = preset(memory_gb=1e-3)
    net_only["kernel"]["grid"] = {}
    net_only["train"]["grid"] = {"none": {"lr": [0.1], "lambda": [0.0]}}
    checked(net_only)  # no kernel model: nothing to estimate


def test_certification_fits_wherever_training_does():
    """Proposition 2.2 without the cached (N, N) arrays needs O(N (d + K)): the training's
    (N, N) matrix decides; at the paper's scale certification needs under 5% of it."""
    for shape in DATASET_SHAPES.values():
        for N in (1, 100, 2000, shape.n_train):
            cert = certify_minimum_bytes(N, shape.dim, shape.classes)
            for reg in ("kernel_logreg", "kernel_cl"):
                train = train_minimum_bytes(shape.n_train, N, shape.dim, shape.classes, reg)
                assert cert < train
    assert certify_minimum_bytes(60000, 784, 10) < 0.05 * BYTES * 60000**2


@pytest.mark.slow
def test_snakemake_stops_before_any_job_with_the_estimate(tmp_path):
    cfg = preset(memory_gb=16)
    cfg["results"] = "results"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(snakemake_cmd(tmp_path, "-n", configfile=path), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "kernel models do not fit kernel.memory_gb" in out, out
    assert "kernel.n_centers (0: 60,000 expansion points on mnist)" in out, out
    assert "Job stats" not in out and dry_run_jobs(proc.stdout) == []
    assert not (tmp_path / "results").exists()


# ---------------------------------------------------------------------------------------------
# Job resources from the config


def resources(cfg, model, stage, dataset="mnist"):
    return job_resources(cfg, training_grid(cfg)[model], dataset, stage)


def test_job_resources_follow_the_config():
    cfg = validate(preset())
    model = "kernel_cl-a1-lam0.01-seed0"
    train = resources(cfg, model, "train")
    # device auto may run on the CPU: the host needs the plan's peak, and a GPU is asked for
    peak = train_plan(60000, 60000, 784, 10, "kernel_cl", 70 * GIB).peak_bytes
    assert train["mem_mb"] >= peak / 2**20 > 50 * 1024 and train["gpu"] == 1
    for stage in ("certify", "attack"):
        assert resources(cfg, model, stage)["gpu"] == 1  # every job on the device claims it
    cuda = validate({**preset(), "device": "cuda"})
    assert resources(cuda, model, "train")["mem_mb"] < 8 * 1024  # the plan is in GPU memory
    cpu = validate({**preset(n_centers=20000, memory_gb=16), "device": "cpu"})
    assert all(resources(cpu, model, s)["gpu"] == 0 for s in ("train", "certify", "attack"))
    peak = train_plan(60000, 20000, 784, 10, "kernel_cl", 16 * GIB).peak_bytes
    assert resources(cpu, model, "train")["mem_mb"] >= peak / 2**20
    # the default: 1,000 centres on mnist5k; with device auto every job claims the GPU
    default = validate(
        {
            "datasets": ["mnist5k"],
            "train": {"grid": {}},
            "certify": {},
            "attack": {},
            "kernel": {"grid": {"kernel_cl": {"a": [1.0], "lambda": [0.1]}}},
        }
    )
    tiny = training_grid(default)["kernel_cl-a1-lam0.1-seed0"]
    assert job_resources(default, tiny, "mnist5k", "train")["gpu"] == 1
    for stage in ("certify", "attack"):
        got = job_resources(default, tiny, "mnist5k", stage)
        assert got["gpu"] == 1 and got["mem_mb"] < 4000, got
    # runtimes grow with the model and the number of points
    small = validate({**preset(n_centers=2000, memory_gb=16), "device": "cpu"})
    for stage in ("train", "certify", "attack"):
        assert resources(cpu, model, stage)["runtime"] > resources(small, model, stage)["runtime"]
    fewer = copy.deepcopy(cpu)
    fewer["certify"]["n_points"] = cpu["certify"]["n_points"] // 10
    assert (
        resources(fewer, model, "certify")["runtime"] < resources(cpu, model, "certify")["runtime"]
    )
    # networks: 4,000 MB; a GPU for every job unless the device is the CPU
    net = NetTrainSpec(epochs=200)
    auto = {**cpu, "device": "auto"}
    assert job_resources(auto, net, "mnist", "train") == {"mem_mb": 4000, "gpu": 1, "runtime": 200}
    assert job_resources(auto, net, "mnist", "certify")["gpu"] == 1
    assert job_resources(auto, net, "mnist", "attack")["gpu"] == 1
    assert all(job_resources(cpu, net, "mnist", s)["gpu"] == 0 for s in ("train", "certify"))
    # a dataset of your own: its size is read by the job, so defaults (kernels: the budget)
    assert job_resources(auto, net, "mydigits", "train") == {
        "mem_mb": 4000,
        "gpu": 1,
        "runtime": 120,
    }
    own = job_resources(cpu, training_grid(cpu)[model], "mydigits", "train")
    assert own["gpu"] == 0 and own["mem_mb"] >= 16 * 1024


def test_attack_runtime_counts_the_minimal_norm_attack():
    """The attack jobs' runtime follows the minimal-norm attack's iterations: an hour
    without it (as before), more with it on many points on the CPU, and a day where the
    model's size is unknown when the workflow is planned."""
    cfg = validate({**preset(n_centers=20000, memory_gb=16), "device": "cpu"})
    # the thorough budget (attacks.min_norm.THOROUGH), whose walks alone need over an hour
    cfg["attack"].update(min_norm_steps=200, min_norm_targets=9, min_norm_restarts=8)
    off = copy.deepcopy(cfg)
    off["attack"]["min_norm_steps"] = 0
    net, kernel = NetTrainSpec(epochs=3), training_grid(cfg)["kernel_cl-a1-lam0.01-seed0"]
    assert job_resources(off, net, "mnist", "attack")["runtime"] == 60
    on = job_resources(cfg, net, "mnist", "attack")["runtime"]
    assert on > 60  # 10,000 points x 18 walks x 200 iterations of a 784-1024 net on a CPU
    longer = copy.deepcopy(cfg)
    longer["attack"]["min_norm_steps"] *= 2
    assert job_resources(longer, net, "mnist", "attack")["runtime"] > on
    few = copy.deepcopy(cfg)
    few["attack"]["n_points"] = 100
    assert job_resources(few, net, "mnist", "attack")["runtime"] == 60
    assert job_resources(cfg, None, "mnist", "attack")["runtime"] == 24 * 60  # trained elsewhere
    assert job_resources(cfg, net, "mydigits", "attack")["runtime"] == 24 * 60
    k_off = job_resources(off, kernel, "mnist", "attack")["runtime"]
    assert job_resources(cfg, kernel, "mnist", "attack")["runtime"] > k_off


@pytest.mark.slow
def test_dry_run_shows_the_resources_of_kernel_jobs(tmp_path):
    cfg = {
        "datasets": ["mnist5k"],
        "device": "cpu",
        "train": {"grid": {}},
        "kernel": {
            "n_centers": 3000,
            "memory_gb": 2,
            "grid": {"kernel_cl": {"a": [1.0], "lambda": [0.1]}},
        },
        "certify": {"n_points": 50, "kinds": ["local"]},
        "attack": {"n_points": 50, "norms": ["l2"]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(snakemake_cmd(tmp_path, "-n", configfile=path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = {j["rule"]: fields(j["resources"]) for j in dry_run_jobs(proc.stdout)}
    spec = training_grid(validate(copy.deepcopy(cfg)))["kernel_cl-a1-lam0.1-seed0"]
    for stage in ("train", "certify", "attack"):
        want = job_resources(validate(copy.deepcopy(cfg)), spec, "mnist5k", stage)
        got = jobs[stage]
        assert int(got["mem_mb"]) == want["mem_mb"] > 2000, (stage, got)
        assert int(got["runtime"]) == want["runtime"] and got.get("gpu", "0") == "0", got


# ---------------------------------------------------------------------------------------------
# CUDA


def blobs(n, d, k, seed):
    gen = np.random.default_rng(seed)
    means = gen.random((k, d))
    y = gen.integers(0, k, n)
    return (means[y] + 0.15 * gen.standard_normal((n, d))).astype(np.float32), y


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("reg", ["kernel_logreg", "kernel_cl"])
def test_kernel_training_and_certification_on_cuda_equal_the_cpu(reg):
    x, y = blobs(400, 20, 4, 0)
    data = toy_dataset(x, y, 4, 100, checked=False)  # beyond [0, 1]
    cfg = KernelTrainConfig(
        regularizer=reg, lam=1e-2, n_centers=150, neighbours=10, max_iter=30, tol=1e-12
    )
    # budgets that force the same chunks and recomputation on both devices: the same room
    # beside each device's reserve
    tiny = {
        dev: (train_minimum_bytes(400, 150, 20, 4, reg, dev) + BYTES * 150 * 20) / GIB
        for dev in ("cpu", "cuda")
    }
    plans = [plan_for(cfg, 400, 20, 4, tiny[dev], dev) for dev in ("cpu", "cuda")]
    assert not plans[0].keep_kernel and plans[0].phases() == plans[1].phases()
    cpu = train_kernel(cfg, data, device="cpu", memory_gb=tiny["cpu"])
    gpu = train_kernel(cfg, data, device="cuda", memory_gb=tiny["cuda"])
    assert gpu.metrics["device"].startswith("cuda") and gpu.model.coef.device.type == "cpu"
    a, b = cpu.model.coef.detach(), gpu.model.coef.detach()
    assert ((a - b).abs().max() / a.abs().max()) < 1e-8
    assert gpu.metrics["test_error"] == cpu.metrics["test_error"]
    xe = torch.as_tensor(x[:12])
    small = {
        dev: (certify_minimum_bytes(150, 20, 4, dev) + BYTES * 150 * 30 * 2) / GIB
        for dev in ("cpu", "cuda")
    }
    assert not certify_plan_for(gpu.model, small["cuda"], "cuda").cache_pairs
    for budget in (None, small):
        on_cpu = certify_kernel(cpu.model, xe, memory_gb=budget and budget["cpu"], device="cpu")
        on_gpu = certify_kernel(cpu.model, xe, memory_gb=budget and budget["cuda"], device="cuda")
        assert torch.equal(on_cpu["pred"], on_gpu["pred"])
        torch.testing.assert_close(
            on_gpu["guarantee_local"], on_cpu["guarantee_local"], rtol=1e-9, atol=0
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_peak_memory_stays_within_the_budget():
    """The allocator's peak of a Kernel-CL training job with a budget below what the
    dense algorithm needs (Kt, the Gram matrix and its temporaries) stays within the plan's
    peak: its arrays (checked on the CPU by tests/test_kernel_memory.py) and the device's
    reserve (cuBLAS workspaces, the allocator's block slack)."""
    data = toy_dataset(*blobs(12000, 784, 10, 1), 10, 500, checked=False)  # beyond [0, 1]
    N = 6000
    budget = 1.2 * train_minimum_bytes(12000, N, 784, 10, "kernel_cl", "cuda")
    cfg = KernelTrainConfig(regularizer="kernel_cl", lam=1e-2, n_centers=N, max_iter=3)
    plan = plan_for(cfg, 12000, 784, 10, budget / GIB, "cuda")
    assert not plan.keep_kernel and plan.passes > 1
    res = train_kernel(cfg, data, device="cuda", memory_gb=budget / GIB)
    assert res.metrics["memory_peak_gib"] == plan.peak_bytes / GIB <= budget / GIB
    assert res.metrics["cuda_peak_gib"] <= plan.peak_bytes / GIB, res.metrics
    dense = BYTES * (12000 * N * 4 + 2 * N * N)  # Kt, Kt*B, two more (n, N), M and Kt^T Kt
    assert dense > 1.5 * budget

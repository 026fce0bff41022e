"""Progress one can watch: per-epoch and per-batch lines in the log, a live bar on a terminal
only, silence when logging is not configured, and a failed job's reason on the terminal."""

from __future__ import annotations

import logging
import math
import os
import pty
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from crosslip.attacks import refine_upper_bound, upper_bound
from crosslip.certify import certify_kernel, certify_softplus
from crosslip.io.logs import failure_lines, failure_reason, job_tag, recent_failed_logs
from crosslip.models.kernels import GaussianKernelModel
from crosslip.training.core import TrainConfig
from crosslip.training.kernel import KernelTrainConfig, train_kernel
from crosslip.training.single import train

from .helpers import ROOT, random_net, random_points, toy_dataset

#: A progress line: what, done/total unit (percent), rate, then ", key value" pairs.
LINE = re.compile(
    r"^(?P<what>[\w ]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>[\w -]+) \((?P<pct>\d+)%\), "
    r"(?P<rate>[\d.e+-]+|inf) [\w -]+/s, .+ elapsed, ~.+ left(?P<post>(, \S+ \S+)*)$"
)


def progress_lines(caplog, what: str) -> list[dict]:
    """The parsed progress lines of ``what`` logged to ``"crosslip"`` (``post``: the
    trailing ``key value`` pairs as a dict of strings)."""
    out = []
    for rec in caplog.records:
        m = LINE.match(rec.getMessage())
        if rec.name.startswith("crosslip") and m and m["what"] == what:
            post = dict(p.split(" ", 1) for p in m["post"].split(", ")[1:])
            out.append(
                {**m.groupdict(), "done": int(m["done"]), "total": int(m["total"]), "post": post}
            )
    return out


def toy_data(n=96, d=12, k=3, seed=0, n_test=10):
    """``n`` points around ``k`` centres; the test split: the first ``n_test`` of them."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(k, d))
    y = rng.integers(0, k, size=n)
    x = np.clip(centres[y] + 0.08 * rng.standard_normal((n, d)), 0, 1).astype(np.float32)
    return toy_dataset(x, y.astype(np.int64), k, n_test)


def test_training_logs_each_epoch_with_loss_error_and_seconds(caplog):
    caplog.set_level(logging.INFO, logger="crosslip")
    data = toy_data(n_test=20)
    cfg = TrainConfig(
        regularizer="cross_lipschitz", lam=1e-3, lr=0.2, epochs=4, hidden=8, batch_size=16
    )
    res = train(cfg, data)
    lines = progress_lines(caplog, "train")
    assert [ln["done"] for ln in lines] == [1, 2, 3, 4]
    assert {ln["total"] for ln in lines} == {4} and {ln["unit"] for ln in lines} == {"epochs"}
    for line, point in zip(lines, res.metrics["curve"], strict=True):
        post = line["post"]
        assert math.isclose(float(post["loss"]), point["loss"], rel_tol=1e-3)
        assert math.isclose(float(post["penalty"]), point["penalty"], rel_tol=1e-3)
        assert math.isclose(float(post["train_error"]), point["train_error"], abs_tol=1e-4)
        assert 0 < float(post["epoch_seconds"]) < 600
    lrs = [float(ln["post"]["lr"]) for ln in lines]  # the authors' decay at 72% and 88%
    assert lrs == sorted(lrs, reverse=True) and lrs[0] == 0.2 and lrs[-1] < 0.2
    assert lines[-1]["pct"] == "100"


def test_adversarial_training_does_not_log_its_inner_attacks(caplog):
    caplog.set_level(logging.INFO, logger="crosslip")
    cfg = TrainConfig(epochs=2, hidden=6, batch_size=16, setting="adversarial")
    train(cfg, toy_data(n=48))
    assert [ln["done"] for ln in progress_lines(caplog, "train")] == [1, 2]
    assert not any("attack" in r.getMessage() for r in caplog.records)


def test_diverging_training_says_so(caplog):
    caplog.set_level(logging.INFO, logger="crosslip")
    cfg = TrainConfig(regularizer="weight_decay", lam=1.0, lr=1e30, epochs=3, hidden=6)
    res = train(cfg, toy_data(n=48))
    assert res.metrics["status"] == "diverged"
    done = res.metrics["epochs_completed"]
    assert done < 3 and [ln["done"] for ln in progress_lines(caplog, "train")] == list(
        range(1, done + 1)
    )
    assert any(f"non-finite loss in epoch {done + 1}" in r.getMessage() for r in caplog.records)


def test_kernel_training_logs_lbfgs_iterations(caplog):
    caplog.set_level(logging.INFO, logger="crosslip")
    cfg = KernelTrainConfig(
        regularizer="kernel_cl", lam=1e-2, n_centers=30, neighbours=5, max_iter=30
    )
    res = train_kernel(cfg, toy_data(n=60))
    assert any(r.getMessage().startswith("train: 30 centres") for r in caplog.records)
    lines = progress_lines(caplog, "train")
    done = [ln["done"] for ln in lines]
    assert done == sorted(set(done)) and len(done) >= 2, done
    assert done[-1] == res.metrics["lbfgs_iterations"]
    stop = f"train: L-BFGS stopped after {done[-1]} iterations (at most 30), "
    stop += f"{len(res.metrics['curve'])} evaluations"
    assert any(r.getMessage().startswith(stop) for r in caplog.records)
    assert {ln["total"] for ln in lines} == {30} and lines[0]["unit"] == "L-BFGS iterations"
    losses = [c["loss"] for c in res.metrics["curve"]]
    for ln in lines:
        evaluations = int(ln["post"]["evaluations"])
        assert math.isclose(float(ln["post"]["loss"]), losses[evaluations - 1], rel_tol=1e-3)
        assert 0 <= float(ln["post"].get("train_error", 0)) <= 1


def test_certification_logs_points_done_per_batch(caplog):
    caplog.set_level(logging.INFO, logger="crosslip")
    net, x = random_net(6, 3, 5, seed=1), random_points(50, 6, seed=2)
    res = certify_softplus(net, x, batch_size=10, kinds=("local", "global"))
    lines = progress_lines(caplog, "certify")
    assert [ln["done"] for ln in lines] == [10, 20, 30, 40, 50]
    assert all(ln["total"] == 50 and ln["unit"] == "points" for ln in lines)
    assert all(float(ln["rate"]) > 0 for ln in lines)
    assert len(res["pred"]) == 50


def test_kernel_certification_logs_points_done_per_chunk(caplog):
    caplog.set_level(logging.INFO, logger="crosslip")
    gen = torch.Generator().manual_seed(0)
    model = GaussianKernelModel(torch.rand(8, 4, generator=gen, dtype=torch.float64), 3, 0.7)
    with torch.no_grad():
        model.coef.copy_(torch.randn(3, 8, generator=gen, dtype=torch.float64))
    certify_kernel(model, random_points(12, 4, seed=3), chunk=4)
    assert [ln["done"] for ln in progress_lines(caplog, "certify")] == [4, 8, 12]


def test_attacks_log_points_done_and_successes_per_batch(caplog):
    caplog.set_level(logging.INFO, logger="crosslip")
    net, x = random_net(6, 3, 5, seed=4), random_points(20, 6, seed=5)
    ub = upper_bound(net, x, p=2, batch_size=5)
    lines = progress_lines(caplog, "attack L2")
    assert [ln["done"] for ln in lines] == [5, 10, 15, 20]
    successes = [int(ln["post"]["successes"]) for ln in lines]
    assert successes == sorted(successes) and successes[-1] == int(ub.success.sum())
    upper_bound(net, x, p=math.inf, batch_size=10)
    assert [ln["done"] for ln in progress_lines(caplog, "attack Linf")] == [10, 20]
    caplog.clear()
    upper_bound(net, x, p=1, progress=False)
    assert caplog.records == []
    refine_upper_bound(net, x, ub, p=2, steps=3)
    steps = progress_lines(caplog, "refine L2")
    assert steps and [ln["done"] for ln in steps] == list(range(1, len(steps) + 1))
    assert all(int(ln["post"]["points"]) == int(ub.success.sum()) for ln in steps)


# --------------------------------------------------------------------------------------
# what a user sees: nothing from the library alone; a bar on a terminal, lines in files
# --------------------------------------------------------------------------------------
CERTIFY = """
import sys
sys.path.insert(0, {root!r})
from tests.helpers import random_net, random_points
from crosslip.certify import certify_softplus
{setup}
certify_softplus(random_net(6, 3, 5, seed=1), random_points(40, 6, seed=2), batch_size=4,
                 kinds=("local",))
"""


def run_child(setup: str, terminal: bool, tmp_path) -> tuple[str, str]:
    """Run a certification in a fresh Python with ``setup`` (logging) first; stderr a
    pseudo-terminal or a pipe. Returns (stdout, stderr)."""
    code = textwrap.dedent(CERTIFY.format(root=str(ROOT), setup=setup))
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    if not terminal:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout, proc.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=follower, env=env, cwd=tmp_path
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    with proc.stdout:
        out = proc.stdout.read().decode()
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    os.close(leader)
    return out, b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_library_is_silent_without_logging(tmp_path, terminal):
    out, err = run_child("", terminal, tmp_path)
    assert out == "" and err == ""


def test_workflow_logging_on_a_terminal_shows_a_bar_and_files_keep_lines(tmp_path):
    setup = "from crosslip.io.logs import setup_logging\nsetup_logging('logs/certify/ds/m1.log')"
    _, err = run_child(setup, True, tmp_path)
    assert "certify:" in err and "point" in err  # tqdm's bar
    assert "\r" in err
    assert "40/40 points (100%)" not in err  # the plain lines went to the file only
    log = (tmp_path / "logs" / "certify" / "ds" / "m1.log").read_text()
    assert [int(m) for m in re.findall(r"certify: (\d+)/40 points", log)] == list(range(4, 41, 4))


def test_workflow_logging_without_terminal_writes_lines_to_both(tmp_path):
    setup = "from crosslip.io.logs import setup_logging\nsetup_logging('logs/certify/ds/m2.log')"
    _, err = run_child(setup, False, tmp_path)
    assert "\r" not in err
    lines = [ln for ln in err.splitlines() if "certify:" in ln]
    assert len(lines) == 10 and all("[certify/ds/m2]" in ln for ln in lines)
    assert "40/40 points (100%)" in lines[-1]
    log = (tmp_path / "logs" / "certify" / "ds" / "m2.log").read_text()
    assert log.count("certify:") == 10 and "crosslip" in log


def test_job_tag_names_the_job_from_its_log_path():
    tag = job_tag("results/logs/train/mnist5k/none-lr0.2-lam0.log")
    assert tag == "train/mnist5k/none-lr0.2-lam0"
    assert job_tag("/x/logs/summary.log") == "summary"
    assert job_tag("elsewhere/job.log") == "job"
    assert job_tag(None) == ""


# --------------------------------------------------------------------------------------
# a failed job's reason
# --------------------------------------------------------------------------------------
def test_failure_reason_reads_the_last_error_of_a_job_log(tmp_path):
    log = tmp_path / "a.log"
    log.write_text(
        "2026-01-02 10:00:00,001 INFO crosslip: starting\n"
        "2026-01-02 10:00:01,002 ERROR crosslip: cifar10: not available offline; set "
        "data.mirrors.cifar10\n"
    )
    assert failure_reason(log) == "cifar10: not available offline; set data.mirrors.cifar10"
    log.write_text(  # a message of several lines, then a later INFO record
        "2026-01-02 10:00:01,002 ERROR crosslip: cifar10: could not obtain these files:\n"
        "  cifar-10-python.tar.gz  (connection refused)\n"
        "Place the official files in results/downloads/cifar10.\n"
        "2026-01-02 10:00:02,000 INFO crosslip: bye\n"
    )
    assert failure_reason(log) == (
        "cifar10: could not obtain these files: cifar-10-python.tar.gz"
        "  (connection refused) Place the official files in "
        "results/downloads/cifar10."
    )
    log.write_text(
        "2026-01-02 10:00:00,001 ERROR crosslip: unexpected error\n"
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "RuntimeError: CUDA out of memory\n"
    )
    assert failure_reason(log) == "unexpected error: RuntimeError: CUDA out of memory"
    log.write_text(  # a job stopped from outside: its log ends in a progress line
        "2026-01-02 10:00:00,001 INFO crosslip: train: 44/60 epochs (73%), loss 0.049\n"
    )
    assert failure_reason(log) == (
        "no error in its log: stopped from outside (killed, a time limit, a node failure) or "
        "its outputs went missing, see Snakemake's message; its last line: train: 44/60 "
        "epochs (73%), loss 0.049"
    )
    log.write_text("Killed\n")
    assert failure_reason(log) == "Killed"
    assert "no log file" in failure_reason(tmp_path / "missing.log")
    (tmp_path / "empty.log").write_text("")
    assert "nothing in its log" in failure_reason(tmp_path / "empty.log")
    lines = failure_lines([("prepare_data", "dataset=cifar10", [str(log)])])
    assert lines == [
        "crosslip: 1 job(s) failed:",
        f"  prepare_data (dataset=cifar10): Killed  [log: {log}]",
    ]
    assert failure_lines([]) == []


def test_recent_failed_logs_finds_the_failed_jobs_of_this_run(tmp_path):
    logs = tmp_path / "logs"
    (logs / "train" / "ds").mkdir(parents=True)
    old = logs / "train" / "ds" / "old.log"
    old.write_text("2026-01-02 10:00:00,000 ERROR crosslip: an earlier run's error\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 60
    (logs / "train" / "ds" / "ok.log").write_text("2026-01-02 10:00:00,000 INFO crosslip: fine\n")
    (logs / "prepare_data").mkdir()
    (logs / "prepare_data" / "ds.log").write_text(
        "2026-01-02 10:00:00,000 ERROR crosslip: bad file\n"
    )
    found = recent_failed_logs(logs, since)
    assert found == [("prepare_data", "ds", [str(logs / "prepare_data" / "ds.log")])]


# --------------------------------------------------------------------------------------
# the training curves figure
# --------------------------------------------------------------------------------------
def net_metrics(model_id, reg, setting, losses, status="ok"):
    curve = [
        {"epoch": i + 1, "loss": v, "penalty": v / 10, "train_error": 0.5 / (i + 1)}
        for i, v in enumerate(losses)
    ]
    cfg = {
        "regularizer": reg,
        "lam": 0.0,
        "lr": 0.1,
        "seed": 0,
        "setting": setting,
        "arch": "mlp",
        "keep_hidden": 1.0,
    }
    return {
        "dataset": "ds",
        "model_id": model_id,
        "status": status,
        "test_error": 0.1,
        "curve": curve,
        "config": cfg,
    }


def test_training_curves_are_read_per_dataset_and_family(tmp_path):
    from crosslip.report.training_figure import plot_training_curves, training_curves

    kernel = {
        "dataset": "ds",
        "model_id": "k1",
        "status": "ok",
        "test_error": 0.2,
        "curve": [
            {"evaluation": i + 1, "loss": 2.0 - i / 10, "penalty": 0.1 * i} for i in range(6)
        ],
        "config": {"regularizer": "kernel_cl", "lam": 0.1, "a": 1.0, "seed": 0},
    }
    metrics = [
        net_metrics("b", "none", "plain", [1.0, 0.5, 0.25]),
        net_metrics("a", "cross_lipschitz", "augment", [2.0, 1.5]),
        net_metrics("c", "weight_decay", "plain", [1.0, float("nan")], status="diverged"),
        {**net_metrics("other", "none", "plain", [1.0]), "dataset": "elsewhere"},
        kernel,
    ]
    nets = training_curves(metrics, "ds", "mlp")
    assert [c["model_id"] for c in nets] == ["a", "b", "c"]
    assert list(nets[1]["x"]) == [1, 2, 3] and list(nets[1]["loss"]) == [1.0, 0.5, 0.25]
    assert list(nets[2]["loss"]) == [1.0] and nets[2]["status"] == "diverged"  # finite only
    assert list(nets[1]["train_error"]) == [0.5, 0.25, 0.5 / 3]
    (k,) = training_curves(metrics, "ds", "kernel")
    assert len(k["x"]) == 6 and k["train_error"] is None and k["penalty"][-1] == 0.5
    for family in ("mlp", "kernel", "resnet"):  # resnet: none trained, still a figure
        png, pdf = tmp_path / f"{family}.png", tmp_path / f"{family}.pdf"
        plot_training_curves(metrics, png, pdf, "ds", family)
        assert png.read_bytes()[:4] == b"\x89PNG" and pdf.read_bytes()[:4] == b"%PDF"


# --------------------------------------------------------------------------------------
# a failed job's reason on the terminal, run by Snakemake
# --------------------------------------------------------------------------------------
OFFLINE_CIFAR = {
    "datasets": ["cifar10"],
    "model": {"hidden": 8},
    "train": {"epochs": 1, "grid": {"none": {"lr": [0.2], "lambda": [0.0]}}},
    "certify": {"n_points": 5},
    "attack": {"n_points": 5},
}


def assert_reason_on_terminal(work, stderr: str) -> None:
    """The onerror summary names prepare_data and gives the reason its log holds."""
    log = work / "results" / "logs" / "prepare_data" / "cifar10.log"
    reason = failure_reason(log)
    assert "data.mirrors.cifar10" in reason and "\n" not in reason
    lines = stderr.splitlines()
    assert "crosslip: 1 job(s) failed:" in lines, stderr[-3000:]
    assert f"  prepare_data (cifar10): {reason}  [log: {log.relative_to(work)}]" in lines


@pytest.mark.slow
def test_failed_job_reason_reaches_the_terminal(tmp_path):
    from .workflow_helpers import snakemake

    work = tmp_path / "work"
    proc = snakemake(work, "--cores", "all", config=OFFLINE_CIFAR)
    assert proc.returncode != 0
    assert_reason_on_terminal(work, proc.stderr)
    assert not (work / "results" / "data" / "cifar10.npz").exists()

"""The workflow itself: dry run, lint, a tiny config end to end, nothing to redo after."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from crosslip.certified_accuracy import DEFAULT_RADII, accuracy_columns
from crosslip.config.grid import training_grid
from crosslip.config.schema import default
from crosslip.config.validate import validate
from crosslip.report.tables import SUMMARY_COLUMNS
from crosslip.results_schema import INSTANCE_SCHEMA

from .helpers import (
    ROOT,
    dry_run_counts,
    dry_run_jobs,
    run_snakemake,
    snakemake_cmd,
    trained_models,
)
from .workflow_helpers import THREADS, TINY_RUN
from .workflow_helpers import snakemake as snakemake_in

TINY = TINY_RUN  # the shared tiny run's config (conftest ``tiny_run``)


def snakemake(workdir: Path, *args: str, config: dict | None = None) -> subprocess.CompletedProcess:
    cfg = None
    if config is not None:
        cfg = workdir / "config.yaml"
        cfg.write_text(yaml.safe_dump(config))
    cmd = snakemake_cmd(workdir, *args, configfile=cfg)
    return run_snakemake(cmd, timeout=900)


@pytest.mark.slow
def test_default_config_dry_run(tmp_path):
    proc = snakemake(tmp_path, "-n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    # the five networks train as one batched model, the two kernel models one job each
    assert sorted(trained_models(dry_run_jobs(proc.stdout))) == sorted(
        training_grid(validate(yaml.safe_load((ROOT / "config.yaml").read_text())))
    )
    for rule, count in [
        ("prepare_data", 1),
        ("train", 2),
        ("train_grid_mnist5k_plain_seed0", 1),
        ("certify", 7),
        ("attack", 7),
        ("instances", 7),
        ("summary", 1),
        ("table1", 1),
        ("kernel_table", 1),
        ("figure_bounds", 2),
        ("figure_adversarial", 1),
    ]:
        assert any(line.split() == [rule, str(count)] for line in out.splitlines()), rule
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_lint_is_clean():
    proc = run_snakemake(snakemake_cmd(ROOT, "--lint"), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_bad_config_is_rejected_before_any_job(tmp_path):
    grid = {"dropout": {"lr": [0.1], "keep_hidden": [1.5]}}
    drop = {**TINY, "train": {**TINY["train"], "grid": grid}}
    proc = snakemake(tmp_path, "--cores", "1", config=drop)
    assert proc.returncode != 0 and "1.5" in proc.stderr
    bad = {**TINY, "train": {**TINY["train"], "epochs": -3}}
    proc = snakemake(tmp_path, "--cores", "1", config=bad)
    assert proc.returncode != 0
    assert "epochs" in proc.stderr and "-3" in proc.stderr
    typo = {**TINY, "certfy": {"n_points": 3}}
    proc = snakemake(tmp_path, "--cores", "1", config=typo)
    assert proc.returncode != 0 and "certfy" in proc.stderr
    svm = {**TINY, "kernel": {"grid": {"kernel_svm": {"a": [1.0], "lambda": [0.1]}}}}
    proc = snakemake(tmp_path, "--cores", "1", config=svm)
    assert proc.returncode != 0 and "kernel_svm" in proc.stderr
    kinds = {**TINY, "certify": {"kinds": ["l3"]}}
    proc = snakemake(tmp_path, "--cores", "1", config=kinds)
    assert proc.returncode != 0 and "l3" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_tiny_run_writes_parquet_with_schema(tiny_run):
    files = sorted((tiny_run / "results" / "instances" / "mnist5k").glob("*.parquet"))
    nets = [
        "none-lr0.2-lam0-seed0",
        "weight_decay-lr0.2-lam0.0001-seed0",
        "dropout-lr0.2-keep0.5-seed0",
        "cross_lipschitz-lr0.2-lam0.001-seed0",
    ]
    expect = [n + suffix for n in nets for suffix in ("", "-augment", "-adversarial")]
    expect += [
        "kernel_logreg-a1-lam0-seed0",
        "kernel_logreg-a1-lam0.0001-seed0",
        "kernel_cl-a1-lam0.1-seed0",
    ]
    assert sorted(f.stem for f in files) == sorted(expect)  # every model x regularizer x setting
    for f in files:
        table = pq.read_table(f)
        assert table.schema.equals(INSTANCE_SCHEMA, check_metadata=False)
        df = table.to_pandas()
        assert len(df) == 15 and df["test_index"].is_unique
        assert (df["model_id"] == f.stem).all()
        kernel = f.stem.startswith("kernel")
        assert (df["local_bound"] == ("prop2.2" if kernel else "prop2.3")).all()
        cols = ["guarantee_local", "guarantee_l2"]
        if not kernel:
            cols += [
                "guarantee_global",
                "guarantee_l1",
                "guarantee_linf",
                "guarantee_l2_box",
                "guarantee_l1_box",
                "guarantee_linf_box",
            ]
        for col in cols:
            assert df[col].notna().all() and (df[col] >= 0).all(), (f.stem, col)
        ok = df["attack_success"]
        assert ok.any()
        assert (df.loc[ok, "upper_bound"] >= df.loc[ok, "guarantee_l2"]).all()
        for p in ("l2", "l1", "linf"):
            refined = df[f"upper_bound_{p}_refined"]
            paper = df["upper_bound" if p == "l2" else f"upper_bound_{p}"]
            assert refined.notna().any() and (refined.dropna() <= paper[refined.notna()]).all()
        with np.load(
            tiny_run / "results" / "examples" / "mnist5k" / f"{f.stem}.npz", allow_pickle=False
        ) as ex:
            side = 24 if f.stem.endswith("augment") else 28  # augment: center crops
            # the illustration's candidates: the first attack.example_candidates (20) points
            candidates = min(default("attack.example_candidates"), 15)
            assert ex["x"].shape == (candidates, side * side)
            assert list(ex["shape"]) == [side, side, 1]
            assert np.allclose(ex["adv"], ex["x"] + ex["delta"], atol=1e-6)
        assert (df["correct"] == (df["pred"] == df["label"])).all()
    everything = pd.read_parquet(tiny_run / "results" / "instances")
    assert len(everything) == 15 * 15  # the folder reads as one table
    families = everything.groupby("model_id")["family"].first()
    assert (families[families.index.str.startswith("kernel")] == "kernel").all()
    assert (families[~families.index.str.startswith("kernel")] == "mlp").all()
    assert everything.loc[everything["family"] == "kernel", "kernel_a"].eq(1.0).all()
    assert sorted(everything["setting"].unique()) == ["adversarial", "augment", "plain"]


def test_tiny_run_writes_table_figure_logs(tiny_run):
    res = tiny_run / "results"
    summary = pd.read_csv(res / "tables" / "summary.csv")
    radii = validate(copy.deepcopy(TINY))["certify"]["radii"]
    assert radii == DEFAULT_RADII and radii["l2"][-1] == 1.58
    assert list(summary.columns) == SUMMARY_COLUMNS + accuracy_columns(radii)
    assert "certified_accuracy_l2_1.58" in summary and "attack_accuracy_linf_0.3" in summary
    assert len(summary) == 15 and (summary["status"] == "ok").all()
    assert summary["test_error"].between(0, 1).all()
    assert (summary["mean_upper_bound"] >= summary["mean_guarantee_local"]).all()
    md = (res / "tables" / "summary.md").read_text()
    assert md.count("\n") == 17 and "cross_lipschitz" in md and "kernel_cl" in md
    table1 = pd.read_csv(res / "tables" / "table1_global_local.csv")
    assert len(table1) == 12  # 3 settings x 4 net regularizers; kernels have no global bound
    assert sorted(set(table1["regularizer"])) == [
        "cross_lipschitz",
        "dropout",
        "none",
        "weight_decay",
    ]
    assert table1["mean_ratio_global_local"].between(0, 10).all()
    assert (res / "tables" / "table1_global_local.md").read_text().startswith("| dataset")
    kernel = pd.read_csv(res / "tables" / "kernel.csv")
    assert list(kernel["method"]) == ["No Reg.", "K-LogReg", "K-CL"]
    assert list(kernel["model_id"]) == [
        "kernel_logreg-a1-lam0-seed0",
        "kernel_logreg-a1-lam0.0001-seed0",
        "kernel_cl-a1-lam0.1-seed0",
    ]
    assert (kernel["mean_upper_bound"] >= kernel["mean_guarantee_local"]).all()
    for name in ("summary", "table1_global_local", "kernel"):
        tex = (res / "tables" / f"{name}.tex").read_text()
        assert tex.startswith("\\begin{tabular}") and "\\bottomrule" in tex
        assert "kernel\\_" in tex or "cross\\_lipschitz" in tex  # underscores escaped
    figures = sorted(p.name for p in (res / "figures" / "bounds_vs_error").iterdir())
    # one figure per dataset and family, a row per setting (the paper's layout)
    assert figures == sorted(
        f"mnist5k-{f}.{ext}" for ext in ("png", "pdf") for f in ("mlp", "kernel")
    )
    accuracy = sorted(p.name for p in (res / "figures" / "certified_accuracy").iterdir())
    assert accuracy == ["mnist5k-mlp.pdf", "mnist5k-mlp.png"]  # the networks, a row per setting
    for ext, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF")):
        assert (res / "figures" / f"adversarial_samples.{ext}").read_bytes()[:4] == magic
        for fig in (res / "figures" / "bounds_vs_error").glob(f"*.{ext}"):
            assert fig.read_bytes()[:4] == magic
    assert (res / "logs" / "train" / "mnist5k" / "none-lr0.2-lam0-seed0.log").stat().st_size > 0
    # one benchmark file per job: the kernel models' and each setting's networks' batches
    bench = res / "benchmarks"
    for stage in ("certify_grid", "attack_grid"):
        assert sorted(p.name for p in (bench / stage / "mnist5k").iterdir()) == [
            "kernel-plain.tsv",
            "mlp-adversarial.tsv",
            "mlp-augment.tsv",
            "mlp-plain.tsv",
        ]
    assert not list(res.rglob("*.tmp")) and not list(res.rglob(".*.part"))


def test_tiny_run_logs_progress_and_draws_training_curves(tiny_run):
    res = tiny_run / "results"
    logs = res / "logs"
    net, kern = "none-lr0.2-lam0-seed0", "kernel_cl-a1-lam0.1-seed0"
    train_log = (logs / "train" / "mnist5k" / f"{net}.log").read_text()
    assert "train: 1/1 epochs (100%)" in train_log and ", loss " in train_log
    assert "L-BFGS iterations" in (logs / "train" / "mnist5k" / f"{kern}.log").read_text()
    certify_log = (logs / "certify" / "mnist5k" / f"{net}.log").read_text()
    # certified in one job with the setting's other networks: its own lines only
    assert certify_log.count("certify: 15/15 points (100%)") == 1
    assert certify_log.count("mean local guarantee") == 1
    attack_log = (logs / "attack" / "mnist5k" / f"{net}.log").read_text()
    assert "attack L2: 15/15 points (100%)" in attack_log and "attack Linf: 15/15" in attack_log
    figures = sorted(p.name for p in (res / "figures" / "training").iterdir())
    assert figures == [f"mnist5k-{f}.{ext}" for f in ("kernel", "mlp") for ext in ("pdf", "png")]
    for fig in (res / "figures" / "training").iterdir():
        assert fig.read_bytes()[:4] == (b"%PDF" if fig.suffix == ".pdf" else b"\x89PNG")


def test_html_report_shows_tables_and_figures(tiny_run, tmp_path):
    report = tmp_path / "report.html"  # not in the shared run's folder
    proc = snakemake_in(tiny_run, "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = report.read_text()
    for caption in (
        "Table 1 of the paper",
        "The kernel table of Section 5",
        "The paper's illustration",
        "One row per trained model",
        "model family kernel",
        "Training curves, dataset mnist5k",
    ):
        assert caption in html, caption
    for name in (
        "table1_global_local.csv",
        "kernel.csv",
        "adversarial_samples.png",
        "mnist5k-mlp.png",
    ):
        assert name in html, name


def test_readme_query_runs_on_the_results(tiny_run, monkeypatch):
    """The README's example query runs unchanged on a run's results, prints a non-empty
    answer, and the answer is the summary's: per regularizer, the largest mean best L2
    certificate among the networks within 2 points of the best network's test error."""
    readme = (ROOT / "README.md").read_text()
    code = readme.split("<!-- query example -->")[1].split("```python")[1].split("```")[0]
    monkeypatch.chdir(tiny_run)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    best = scope["best"]
    summary = pd.read_csv(tiny_run / "results" / "tables" / "summary.csv")
    nets = summary[(summary["family"] == "mlp") & (summary["status"] == "ok")]
    close = nets[nets["test_error"] <= nets["test_error"].min() + 0.02]
    expected = close.groupby("regularizer")["mean_guarantee_l2_best"].max()
    assert len(best) > 0 and best.notna().all()
    assert best.to_dict() == pytest.approx(expected.to_dict(), rel=1e-12)
    assert list(best) == sorted(best, reverse=True)


def test_the_run_ends_with_what_it_found(tiny_run):
    """The last lines of a run: per model its test error, mean best certificate and attack
    and certified accuracy at the first L2 radius, then where the tables, figures and the
    report are; at most about 20 lines."""
    out = (tiny_run / "run-stdout.txt").read_text().splitlines()
    start = max(i for i, line in enumerate(out) if line.startswith("crosslip: "))
    block = out[start:]  # the end of what the run printed
    summary = pd.read_csv(tiny_run / "results" / "tables" / "summary.csv")
    assert "certified at 0.5" in block[1] and "best certificate" in block[1]
    shown = [line for line in block if line.startswith("mnist5k ")]
    assert len(shown) == min(len(summary), 12)
    row = summary.sort_index().iloc[0]
    first = shown[0].split()
    assert first[1] == row["model_id"] and first[2] == f"{100 * row['test_error']:.1f}%"
    assert any(line.startswith("tables:  results/tables/") for line in block)
    assert any("certified_accuracy" in line and line.startswith("figures:") for line in block)
    assert any(line.startswith("report:  snakemake --report") for line in block)
    assert len(block) <= 20 and block[-1].startswith("report:")


def test_second_run_has_nothing_to_do(tiny_run):
    proc = snakemake_in(tiny_run, "-n")  # its own config file
    assert proc.returncode == 0, proc.stderr
    assert "Nothing to be done" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_resnet_config_runs_end_to_end(tmp_path):
    """model.arch = resnet (ResNet-8 here): trained with Cross-Lipschitz (double
    backpropagation) to a test error well below chance, attacked; guarantees stay empty (no
    local bound for deep nets). On 600 of mnist5k's digits at 7 x 7 (every fourth pixel;
    an npz dataset of one's own): the run took 10.5 s alone and reached a test error of
    0.37 (1,500 digits: 16.2 s, 0.34; at 14 x 14 the run took 19.7 s, error 0.185; at 28 x
    28 the training 35 s, error 0.32), and checked nothing more. One thread per job
    (THREADS): two made the test no faster alone (17.6 s against 17.9 s), and three times
    slower beside another pytest-xdist worker, where the idle thread spins."""
    from crosslip.data.embedded import load_mnist5k

    digits = load_mnist5k()
    rng = np.random.default_rng(0)
    train = rng.permutation(len(digits.x_train))[:600]
    test = rng.permutation(len(digits.x_test))[:200]
    np.savez(
        tmp_path / "digits.npz",
        x_train=digits.x_train[train].reshape(-1, 28, 28)[:, ::4, ::4],
        y_train=digits.y_train[train],
        x_test=digits.x_test[test].reshape(-1, 28, 28)[:, ::4, ::4],
        y_test=digits.y_test[test],
    )
    cfg = {
        "datasets": [{"name": "digits", "format": "npz", "path": str(tmp_path / "digits.npz")}],
        "model": {"arch": "resnet", "resnet_blocks": 1},
        "train": {
            "epochs": 1,
            "batch_size": 16,
            "grid": {"cross_lipschitz": {"lr": [0.1], "lambda": [1e-3]}},
        },
        "certify": {"n_points": 5},
        "attack": {
            **{"n_points": 5, "norms": ["l2"], "refine_steps": 1},
            **{"min_norm_steps": 10, "min_norm_targets": 2, "min_norm_restarts": 1},
        },
    }
    proc = snakemake(tmp_path, "--cores", "2", *THREADS, config=cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    df = pd.read_parquet(tmp_path / "results" / "instances")
    assert len(df) == 5 and (df["local_bound"] == "none").all()
    assert df["guarantee_local"].isna().all() and df["upper_bound"].notna().any()
    summary = pd.read_csv(tmp_path / "results" / "tables" / "summary.csv")
    assert (summary["test_error"] < 0.5).all()


@pytest.mark.slow
def test_resnet_grid_on_cifar10_format_runs_end_to_end(tmp_path):
    """Every ResNet regularizer in the plain and augment settings (colour augmentation) on
    CIFAR-10 data read from an archive in the official format (tiny: 15 train / 3 test
    images; the real one needs a download), through the real workflow, each setting's models
    certified and attacked in one job."""
    from crosslip.data import save_prepared
    from crosslip.data.cifar10 import read_cifar10_archive

    from .test_data_archives import tiny_cifar

    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(tiny_cifar())
    prepared = tmp_path / "results" / "data" / "cifar10.npz"
    prepared.parent.mkdir(parents=True)
    save_prepared(read_cifar10_archive(archive), prepared)
    before = prepared.read_bytes()
    regs = {
        r: {"lr": [0.05], "lambda": [lam]}
        for r, lam in (("none", 0.0), ("weight_decay", 1e-4), ("cross_lipschitz", 1e-3))
    }
    regs["dropout"] = {"lr": [0.05], "keep_hidden": [0.5]}
    cfg = {
        "datasets": ["cifar10"],
        "model": {"arch": "resnet", "resnet_blocks": 1},
        "train": {"epochs": 1, "batch_size": 8, "settings": ["plain", "augment"], "grid": regs},
        # each setting's ResNets certified (attacked) in one job: the batched evaluation of
        # ResNets (test_resnet_config_runs_end_to_end has one job per model), 4 jobs, not 16
        "certify": {"n_points": 3, "kinds": ["local"], "batch_models": True},
        # a short minimal-norm attack: its default 200 steps x 18 walks of a ResNet on the
        # CPU took 5 minutes of this test
        "attack": {
            **{"n_points": 3, "norms": ["l2"], "refine_steps": 1, "batch_models": True},
            **{"min_norm_steps": 10, "min_norm_targets": 2, "min_norm_restarts": 1},
        },
    }
    proc = snakemake(tmp_path, "--cores", "2", *THREADS, config=cfg)  # 2 jobs at once
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert prepared.read_bytes() == before  # the prepared archive was used as it is
    df = pd.read_parquet(tmp_path / "results" / "instances")
    assert len(df) == 3 * 8 and (df["family"] == "resnet").all()
    assert sorted(set(df["setting"])) == ["augment", "plain"]
    assert set(df["regularizer"]) == set(regs)
    # 15 random images, one epoch: nearly constant models, whose attacks may all fail; a
    # failure is marked, never dropped (test_resnet_config_runs_end_to_end sees successes)
    assert (df["upper_bound"].notna() == df["attack_success"]).all()
    for model_id in set(df["model_id"]):
        met = json.loads(
            (tmp_path / "results" / "models" / "cifar10" / model_id / "metrics.json").read_text()
        )
        assert met["config"]["arch"] == "resnet" and met["status"] == "ok"
        ex = np.load(tmp_path / "results" / "examples" / "cifar10" / f"{model_id}.npz")
        side = 24 if model_id.endswith("augment") else 32
        assert list(ex["shape"]) == [side, side, 3]
    figures = tmp_path / "results" / "figures" / "bounds_vs_error"
    assert sorted(p.name for p in figures.glob("*.png")) == [
        "cifar10-resnet.png",
    ]
    assert not (tmp_path / "results" / "tables" / "table1_global_local.csv").exists()


PRESETS = {  # preset -> (train jobs of the paper's grid, evaluated models, figures)
    "mnist": (78, 78, 1),
    "cifar10": (78, 78, 1),
    "gtsrb": (26, 26, 1),
    "mnist_kernel": (36, None, 1),  # certify.models: best, chosen by a checkpoint
    "mnist_illustration": (62, None, 2),  # 26 networks + 36 kernel models; best per method
    "cifar10_resnet": (62, 62, 1),
}


def test_every_preset_is_listed():
    found = sorted(p.stem for p in (ROOT / "config" / "presets").glob("*.yaml"))
    assert found == sorted(PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_dry_run_lists_the_paper_grid(tmp_path, preset):
    proc = snakemake(
        tmp_path, "-n", "--configfile", str(ROOT / "config" / "presets" / f"{preset}.yaml")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = dry_run_counts(proc.stdout)
    n_models, n_evaluated, n_figures = PRESETS[preset]
    trained = trained_models(dry_run_jobs(proc.stdout))
    assert len(trained) == len(set(trained)) == n_models, counts
    if n_evaluated is None:  # the checkpoint decides after training: none listed yet
        assert counts["select_models"] == 1 and "certify" not in counts
    else:
        for rule in ("certify", "attack", "instances"):
            assert counts[rule] == n_evaluated, (rule, counts)
    assert counts["figure_bounds"] == n_figures and counts["summary"] == 1
    assert counts.get("kernel_table", 0) == (preset in ("mnist_kernel", "mnist_illustration"))
    assert counts.get("table1", 0) == (
        preset in ("mnist", "cifar10", "gtsrb", "mnist_illustration")
    )
    assert counts["figure_adversarial"] == 1

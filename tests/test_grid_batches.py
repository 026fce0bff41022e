"""Which networks train together (crosslip.jobs.batches), and how Snakemake sees it.

Without Snakemake: the tracked params and the model id give back the whole spec for every
preset; networks of one dataset, setting and seed that need training form one batch; what
"needs training" means; a certify or attack job gets exactly the params its script reads,
from one definition for both rule forms; the scripts share one as_list; the shim that hands
--set-threads / --set-resources to the batched rules works on the installed Snakemake's
objects. With Snakemake, on the shared tiny run (trained, certified and attacked in
batches): the files are those of one job per model, each log holds its own model's lines, a
new grid value trains alone, a changed epoch count retrains every network in batches, a
model certified in a batch sees no params changed under the per-model rule, and
--set-threads / --set-resources for `train`, `certify` and `attack` reach the batched rules.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from crosslip.config.grid import tracked_params, training_grid
from crosslip.config.specs import spec_from_tracked, spec_params
from crosslip.config.validate import validate
from crosslip.errors import ConfigError
from crosslip.jobs.batches import evaluation_params, needs_training, plan_batches
from crosslip.jobs.files import as_list
from crosslip.jobs.resources import job_threads
from crosslip.jobs.snakemake_internals import take_overrides

from .helpers import (
    ROOT,
    dry_run_jobs,
    fields,
    run_snakemake,
    snakemake_cmd,
    stage_of,
    trained_models,
)
from .workflow_helpers import TINY_RUN, snakemake

PRESETS = [*sorted((ROOT / "config" / "presets").glob("*.yaml")), ROOT / "config.yaml"]
CODE = "digest-of-train.py"


def load(path: Path) -> dict:
    return validate(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_the_tracked_params_and_the_id_give_back_the_whole_spec(path):
    config = load(path)
    grid, tracked = training_grid(config), tracked_params(config)
    for model_id, spec in grid.items():
        assert spec_from_tracked(model_id, tracked[model_id]) == spec, model_id
    # the networks of one setting and seed share what is tracked: one job may train them
    by_setting: dict[tuple, set[str]] = {}
    for model_id, spec in grid.items():
        if getattr(spec, "setting", None):
            key = (spec.setting, spec.seed)
            by_setting.setdefault(key, set()).add(json.dumps(tracked[model_id], sort_keys=True))
    assert all(len(v) == 1 for v in by_setting.values())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("train.epochs", 3),
        ("train.batch_size", 32),
        ("train.lr_decay", 0.5),
        ("train.lr_decay_at", [0.5]),
        ("train.keep_input", 0.8),
        ("train.crop", 20),
        ("train.adv_norm", "l2"),
        ("train.adv_fraction", 0.25),
        ("train.tf32", True),
        ("model.hidden", 32),
        ("model.alpha", 5.0),
        ("model.bias", True),
        ("model.init", "pytorch"),
    ],
)
def test_every_training_setting_is_tracked(key, value):
    """A setting that changes a network's spec changes its tracked params (so Snakemake
    retrains it): nothing of the spec can change unseen."""
    base = load(ROOT / "config.yaml")
    changed = copy.deepcopy(base)
    section, name = key.split(".")
    changed[section][name] = value
    before, after = tracked_params(base), tracked_params(validate(changed))
    nets = [m for m, s in training_grid(base).items() if hasattr(s, "setting")]
    assert nets and all(before[m] != after[m] for m in nets)


def test_grid_values_must_name_their_model_exactly():
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["train"]["grid"]["cross_lipschitz"]["lambda"] = [1.0e-3, 0.123456789]
    with pytest.raises(ConfigError, match=r"train\.grid\.cross_lipschitz\.lambda\[1\]"):
        validate(config)


def params_read(script: str) -> set[str]:
    """The names ``X`` of every ``snakemake.params.X`` that a workflow script reads."""
    tree = ast.parse((ROOT / "workflow" / "scripts" / script).read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "params"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "snakemake"
    }


@pytest.mark.parametrize("stage", ["certify", "attack"])
def test_an_evaluation_job_gets_exactly_the_params_its_script_reads(stage):
    """The per-model and the batched certify (attack) rules pass
    crosslip.jobs.batches.evaluation_params and the code digest; the script reads them whole
    into its settings object, whose fields they are exactly (a param that the script ignored
    would still rerun jobs when it changes)."""
    import dataclasses

    from crosslip.attacks.settings import FLAT_NAMES
    from crosslip.certify.settings import CertifySettings

    config = validate(copy.deepcopy(TINY_RUN))
    params = evaluation_params(config, stage)
    script = (ROOT / "workflow" / "scripts" / f"{stage}.py").read_text()
    assert "Settings.from_params(dict(snakemake.params.items()))" in script
    assert params_read(f"{stage}.py") == {"items"}  # no param read on its own
    fields = (
        {f.name for f in dataclasses.fields(CertifySettings)}
        if stage == "certify"
        else set(FLAT_NAMES)
    )
    assert set(params) == fields
    assert params["n_points"] == 15 and params["device"] == config["device"]
    with pytest.raises(ValueError, match="certify or attack"):
        evaluation_params(config, "train")


def test_a_script_takes_one_file_or_several_as_a_list():
    """crosslip.jobs.files.as_list, shared by the train, certify and attack scripts: a
    per-model rule gives one path, a batched rule several."""
    assert as_list("results/models/m/model.pt") == ["results/models/m/model.pt"]
    assert as_list(("a.pt", "b.pt")) == ["a.pt", "b.pt"]
    scripts = ROOT / "workflow" / "scripts"
    assert not [p.name for p in scripts.glob("*.py") if "def as_list" in p.read_text()]


def test_take_overrides_works_on_the_installed_snakemakes_objects():
    """crosslip.jobs.snakemake_internals.take_overrides, a shim over Snakemake's internals, on the
    installed Snakemake's own objects: the settings built from its command line as its CLI
    builds them, rules with its Resources. Fails where a release moves what the shim reads
    or writes (the slow test below checks the result in real dry runs)."""
    from snakemake.cli import parse_args
    from snakemake.resources import Resources
    from snakemake.rules import Rule
    from snakemake.settings.types import ResourceSettings
    from snakemake.workflow import Workflow

    assert "resource_settings" in {f.name for f in dataclasses.fields(Workflow)}
    assert callable(Workflow.get_rule)
    argv = ["--set-threads", "train=1", "certify=3", "--set-resources", "train:runtime=241"]
    _, args = parse_args(["-s", str(ROOT / "Snakefile"), "--workflow-profile", "none", *argv])
    settings = ResourceSettings(
        overwrite_threads=args.set_threads, overwrite_resources=args.set_resources
    )
    rules = {}
    for name in ("train_grid_a", "certify_grid_a", "attack_grid_a"):
        rules[name] = Rule(name, None, 0, str(ROOT / "Snakefile"))
        assert rules[name].resources is None  # Snakemake fills it in when it adds the rule
        rules[name].resources = Resources.from_mapping({"_cores": 2, "runtime": 60})
    workflow = SimpleNamespace(resource_settings=settings, get_rule=rules.__getitem__)
    for name in rules:
        take_overrides(workflow, name, name.split("_grid_")[0])
    values = {name: {k: r.value for k, r in rule.resources.items()} for name, rule in rules.items()}
    assert values == {
        "train_grid_a": {"_cores": 1, "runtime": 241},
        "certify_grid_a": {"_cores": 3, "runtime": 60},
        "attack_grid_a": {"_cores": 2, "runtime": 60},  # nothing given for attack
    }
    # plain values, as the Python API takes them: the rule's Resources convert them
    api = ResourceSettings(
        overwrite_threads={"train": 4}, overwrite_resources={"train": {"runtime": 7}}
    )
    take_overrides(
        SimpleNamespace(resource_settings=api, get_rule=rules.__getitem__), "train_grid_a", "train"
    )
    assert rules["train_grid_a"].resources["_cores"].value == 4
    assert rules["train_grid_a"].resources["runtime"].value == 7


def fresh(tmp_path: Path, **train) -> dict:
    """TINY_RUN with ``train`` keys (the test runs in ``tmp_path``: results go there)."""
    assert Path.cwd() == tmp_path
    config = copy.deepcopy(TINY_RUN)
    config["train"].update(train)
    return validate(config)


def test_a_fresh_grid_trains_in_one_batch_per_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = fresh(tmp_path)
    grid = training_grid(config)
    batches = plan_batches(config, grid, CODE)
    assert sorted(b.setting for b in batches) == ["adversarial", "augment", "plain"]
    for b in batches:
        assert len(b.models) == 4 and b.dataset == "mnist5k" and b.seed == 0
        assert all(grid[m].setting == b.setting for m in b.models)
        assert b.name == f"train_grid_mnist5k_{b.setting}_seed0"
    assert not any(m.startswith("kernel") for b in batches for m in b.models)
    assert plan_batches(fresh(tmp_path, batch_grid=False), grid, CODE) == []
    two_seeds = fresh(tmp_path, seeds=[0, 1])
    assert len(plan_batches(two_seeds, training_grid(two_seeds), CODE)) == 6


def finish(config: dict, model_id: str, code: str = CODE) -> Path:
    """Files of a trained model as a training job leaves them."""
    folder = Path(config["results"]) / "models" / "mnist5k" / model_id
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"weights")
    spec = training_grid(config)[model_id]
    (folder / "metrics.json").write_text(json.dumps({"config": spec_params(spec), "code": code}))
    return folder


def test_what_needs_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = fresh(tmp_path)
    grid = training_grid(config)
    plain = sorted(m for m, s in grid.items() if getattr(s, "setting", "") == "plain")
    done = finish(config, plain[0])
    assert not needs_training(config["results"], "mnist5k", plain[0], grid[plain[0]], CODE)
    assert needs_training(config["results"], "mnist5k", plain[0], grid[plain[0]], "other code")
    other = grid[plain[1]]  # the recorded spec is not this one
    assert needs_training(config["results"], "mnist5k", plain[0], other, CODE)
    assert needs_training(config["results"], "mnist5k", plain[1], grid[plain[1]], CODE)
    # the data prepared again after the model: Snakemake retrains it
    data = Path(config["results"]) / "data" / "mnist5k.npz"
    data.parent.mkdir(parents=True)
    data.write_bytes(b"x")
    os.utime(done / "model.pt", (1, 1))
    assert needs_training(config["results"], "mnist5k", plain[0], grid[plain[0]], CODE)
    os.utime(data, (0, 0))
    assert not needs_training(config["results"], "mnist5k", plain[0], grid[plain[0]], CODE)
    (done / "metrics.json").write_text("{not json")
    assert needs_training(config["results"], "mnist5k", plain[0], grid[plain[0]], CODE)


def test_only_networks_that_need_training_are_batched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = fresh(tmp_path)
    grid = training_grid(config)
    plain = sorted(m for m, s in grid.items() if getattr(s, "setting", "") == "plain")
    for m in plain[:3]:
        finish(config, m)
    batches = {b.setting: b for b in plan_batches(config, grid, CODE)}
    assert "plain" not in batches  # one network left: it trains in a job of its own
    assert sorted(batches) == ["adversarial", "augment"]
    finish(config, plain[3], code="older code")
    batches = {b.setting: b for b in plan_batches(config, grid, CODE)}
    assert "plain" not in batches
    shutil.rmtree(Path(config["results"]) / "models" / "mnist5k" / plain[0])
    batches = {b.setting: b for b in plan_batches(config, grid, CODE)}
    assert batches["plain"].models == (plain[0], plain[3])


# ---------------------------------------------------------------------------------------
# Snakemake


@pytest.fixture
def run(tiny_run, tmp_path):
    """A copy of the finished tiny run (trained in batches), mtimes kept."""
    work = tmp_path / "work"
    shutil.copytree(tiny_run, work, symlinks=True)
    return work


def plan(work: Path, config: dict, *args: str) -> list[dict]:
    proc = snakemake(work, "-n", *args, config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dry_run_jobs(proc.stdout)


def test_a_batched_run_writes_the_files_of_one_job_per_model(tiny_run, tmp_path):
    res = tiny_run / "results"
    grid = training_grid(validate(copy.deepcopy(TINY_RUN)))
    nets = [m for m, s in grid.items() if hasattr(s, "setting")]
    assert len(nets) == 12
    assert sorted(p.name for p in (res / "benchmarks" / "train_grid" / "mnist5k").iterdir()) == [
        "adversarial-seed0.tsv",
        "augment-seed0.tsv",
        "plain-seed0.tsv",
    ]
    for m in nets:
        metrics = json.loads((res / "models" / "mnist5k" / m / "metrics.json").read_text())
        assert metrics["model_id"] == m and len(metrics["grid_models"]) == 4
        # on the CPU one after another in the job (crosslip.stages.training.batched_on)
        assert metrics["grid_batched"] is False and metrics["grid_networks"] == 1
        assert m in metrics["grid_models"] and metrics["config"] == spec_params(grid[m])
        log = (res / "logs" / "train" / "mnist5k" / f"{m}.log").read_text()
        assert "train: 1/1 epochs" in log and "status=ok" in log
        # its own lines, not those of the networks trained beside it
        assert log.count("status=") == 1 and log.count("train: 1/1 epochs") == 1
    # the same outputs as one job per model: what a per-model plan of the same config
    # lists is exactly what the batched run wrote
    per_model = copy.deepcopy(TINY_RUN)
    per_model["train"]["batch_grid"] = False
    jobs = plan(tmp_path / "plan", per_model, "--forceall")
    assert not any(j["rule"].startswith("train_grid") for j in jobs)
    listed = {o for j in jobs for o in j["output"]}
    assert sum(j["rule"] == "train" for j in jobs) == len(grid)
    assert not sorted(o for o in listed if not (tiny_run / o).exists())


def test_a_new_grid_value_trains_alone_and_a_new_epoch_count_in_batches(run):
    config = copy.deepcopy(TINY_RUN)
    config["train"]["grid"]["cross_lipschitz"]["lambda"] = [1.0e-3, 1.0e-2]
    jobs = plan(run, config)
    trains = [j for j in jobs if j["rule"].startswith("train")]
    new = [f"cross_lipschitz-lr0.2-lam0.01-seed0{s}" for s in ("", "-augment", "-adversarial")]
    assert sorted((j["rule"], fields(j["wildcards"])["model"]) for j in trains) == sorted(
        ("train", m) for m in new
    )
    assert all("Missing output files" in j["reason"] for j in trains)
    # a setting every network shares: all of them again, one batched job per setting
    config = copy.deepcopy(TINY_RUN)
    config["train"]["epochs"] = 2
    jobs = plan(run, config)
    batched = sorted(j["rule"] for j in jobs if j["rule"].startswith("train_grid"))
    assert batched == [f"train_grid_mnist5k_{s}_seed0" for s in ("adversarial", "augment", "plain")]
    assert not [j for j in jobs if j["rule"] == "train"]  # the kernel models stay
    assert {stage_of(j["rule"]) for j in jobs} >= {"certify", "attack", "instances"}


def test_jobs_get_one_thread_below_four_cores_and_two_where_nothing_bounds_them():
    """A cluster run, --report and --summary give Snakemake no core count (None)."""
    assert [job_threads(c) for c in (None, 1, 2, 3, 4, 64)] == [2, 1, 1, 1, 2, 2]


@pytest.mark.slow
def test_the_batched_rules_take_the_threads_and_resources_given_to_their_stage(tmp_path):
    """What a profile or the command line gives `train`, `certify` or `attack` (e.g.
    profiles/slurm's GPU partition) holds for the batched jobs of that stage too
    (crosslip.jobs.snakemake_internals.take_overrides), and for no other stage."""
    default = [j for j in plan(tmp_path, TINY_RUN, "--cores", "4") if j["rule"] != "all"]
    batched = [j for j in default if "_grid_" in j["rule"]]
    assert sorted({stage_of(j["rule"]) for j in batched}) == ["attack", "certify", "train"]
    assert all(j.get("threads") == "2" for j in batched)
    # a batched training (4 networks here) starts before single-model jobs ready with it
    trains = [j for j in default if stage_of(j["rule"]) == "train"]
    assert {(j["rule"] == "train", j.get("priority", "0")) for j in trains} == {
        (False, "4"),
        (True, "0"),
    }
    # below 4 cores every job of the three stages gets one thread, so that two run at once
    # (crosslip.jobs.resources.job_threads); --set-threads still decides
    small = [j for j in plan(tmp_path, TINY_RUN, "--cores", "2") if j["rule"] != "all"]
    staged = [j for j in small if stage_of(j["rule"]) in ("train", "certify", "attack")]
    assert {stage_of(j["rule"]) for j in staged} == {"train", "certify", "attack"}
    assert all(j.get("threads", "1") == "1" for j in staged)
    given_two = plan(tmp_path, TINY_RUN, "--cores", "2", "--set-threads", "certify=2")
    assert {j.get("threads", "1") for j in given_two if stage_of(j["rule"]) == "certify"} == {"2"}
    jobs = plan(
        tmp_path,
        TINY_RUN,
        "--cores",
        "4",
        "--set-resources",
        "train:runtime=241",
        "train:slurm_partition=gpu",
        "certify:runtime=242",
        "--set-threads",
        "train=1",
        "attack=3",
    )
    batched = [j for j in jobs if "_grid_" in j["rule"]]
    assert len(batched) == 3 + 4 + 4  # train: per setting; certify, attack: also kernels
    given = {
        "train": ("1", {"runtime": "241", "slurm_partition": "gpu"}),
        "certify": ("2", {"runtime": "242"}),
        "attack": ("3", {}),
    }
    for job in batched:
        threads, resources = given[stage_of(job["rule"])]
        assert job.get("threads", "1") == threads, job
        assert resources.items() <= fields(job["resources"]).items(), job
        if stage_of(job["rule"]) != "train":
            assert "slurm_partition" not in fields(job["resources"]), job


@pytest.mark.slow
def test_a_model_moving_between_a_batched_and_a_per_model_evaluation_keeps_its_params(run):
    """The batched and the per-model certify and attack rules pass the same params
    (crosslip.jobs.batches.evaluation_params and the code digest): after a run that
    certified and attacked in batches, the per-model rules (batch_models off) see no params
    changed. They rerun all the same, by Snakemake's other triggers: a per-model job's set
    of input files is not the batch's, nor is the text of its rule (its code, to
    Snakemake). (``--list-changes params`` cannot tell: Snakemake 9.27 lists every file.)"""
    config = copy.deepcopy(TINY_RUN)
    config["certify"]["batch_models"] = config["attack"]["batch_models"] = False
    evaluations = [j for j in plan(run, config) if stage_of(j["rule"]) in ("certify", "attack")]
    assert sorted(j["rule"] for j in evaluations) == ["attack"] * 15 + ["certify"] * 15
    for job in evaluations:
        assert "Set of input files has changed" in job["reason"], job
        assert "Params have changed" not in job["reason"], job
    # what a changed param looks like
    config["certify"]["n_points"] = 14
    certify = [j for j in plan(run, config) if j["rule"] == "certify"]
    assert len(certify) == 15 and all("Params have changed" in j["reason"] for j in certify)


@pytest.mark.slow
def test_the_mnist_preset_on_a_gpu_is_nine_jobs_of_models(tmp_path):
    """config/overrides/gpu.yaml: the MNIST preset trains in one job per setting and
    certifies and attacks in one job per setting; per model only the instances remain."""
    preset = ROOT / "config" / "presets" / "mnist.yaml"
    override = ROOT / "config" / "overrides" / "gpu.yaml"
    proc = run_snakemake(
        snakemake_cmd(tmp_path, "-n", "--configfile", str(preset), str(override)), timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = dry_run_jobs(proc.stdout)
    by_stage: dict[str, list[str]] = {}
    for job in jobs:
        by_stage.setdefault(stage_of(job["rule"]), []).append(job["rule"])
    settings = ("plain", "augment", "adversarial")
    assert sorted(by_stage["train"]) == sorted(f"train_grid_mnist_{s}_seed0" for s in settings)
    for stage in ("certify", "attack"):
        assert sorted(by_stage[stage]) == sorted(f"{stage}_grid_mnist_mlp_{s}" for s in settings)
    assert len(by_stage["instances"]) == len(trained_models(jobs)) == 78

"""Config validation: every malformed value is rejected before any job runs, naming the key
and the allowed values (library calls for the long list, a few cases through the command line)."""

from __future__ import annotations

import copy

import pytest
import yaml

from crosslip.config.grid import training_grid
from crosslip.config.schema import load_schema
from crosslip.config.specs import KernelTrainSpec, NetTrainSpec
from crosslip.config.validate import merged_files, validate
from crosslip.errors import ConfigError

from .helpers import ROOT, dry_run_jobs, run_snakemake, snakemake_cmd, trained_models
from .workflow_helpers import BASE, DELETE, changed, files_under, snakemake

# --------------------------------------------------------------------------------------
# 1. config: rejected before any job runs, naming the key and the allowed values
# --------------------------------------------------------------------------------------

SCHEMA = load_schema()
NETS = "allowed keys: " + ", ".join(SCHEMA["$defs"]["net_grid"]["properties"])
TOP = "allowed keys: " + ", ".join(SCHEMA["properties"])
DATASETS = "one of " + ", ".join(SCHEMA["$defs"]["registered_dataset"]["enum"])
OWN = "a mapping with keys among name, format, path, sha256, checksums"  # a dataset of your own
MIRRORS = "allowed keys: " + ", ".join(
    SCHEMA["properties"]["data"]["properties"]["mirrors"]["propertyNames"]["enum"]
)
RESULTS = "config key results: not allowed"
#: (id, bad config, substrings the message must hold). Each is a distinct bad input.
BAD_CONFIGS = [
    # unknown keys, at every level
    (
        "top-level-key",
        changed(BASE, certfy={"n_points": 3}),
        ["config key certfy: not allowed", TOP, "did you mean certify?"],
    ),
    (
        "nested-key-regularizer",
        changed(BASE, train__grid__svm={"lr": [0.1], "lambda": [0.0]}),
        [f"config key train.grid.svm: not allowed; {NETS}"],
    ),
    (
        "nested-key-model",
        changed(BASE, model__hiden=8),
        ["config key model.hiden: not allowed", "hidden", "did you mean hidden?"],
    ),
    (
        "nested-key-grid-spec",
        changed(BASE, train__grid__none__lambdas=[0.0]),
        ["config key train.grid.none.lambdas: not allowed; allowed keys: lr, lambda"],
    ),
    (
        "nested-key-certify",
        changed(BASE, certify__n_point=5),
        ["config key certify.n_point: not allowed", "n_points"],
    ),
    (
        "unknown-kernel-regularizer",
        changed(BASE, kernel={"grid": {"kernel_svm": {"a": [1.0], "lambda": [0.1]}}}),
        ["config key kernel.grid.kernel_svm: not allowed; allowed keys: kernel_logreg, kernel_cl"],
    ),
    (
        "unknown-mirror",
        changed(BASE, data={"mirrors": {"mnist3": "/data"}}),
        [f"config key data.mirrors.mnist3: not allowed; {MIRRORS}"],
    ),
    (
        "unknown-setting-grid",
        changed(BASE, train__grid_by_setting={"rotate": {}}),
        [
            "config key train.grid_by_setting.rotate: not allowed",
            "allowed keys: plain, augment, adversarial",
        ],
    ),
    # wrong types
    (
        "epochs-string",
        changed(BASE, train__epochs="ten"),
        ['config key train.epochs: wrong type ("ten"); allowed: an integer >= 1'],
    ),
    (
        "epochs-float",
        changed(BASE, train__epochs=2.5),
        ["config key train.epochs: wrong type (2.5); allowed: an integer >= 1"],
    ),
    (
        "epochs-bool",
        changed(BASE, train__epochs=True),
        ["config key train.epochs: wrong type (true)"],
    ),
    (
        "datasets-number",
        changed(BASE, datasets=5),
        ["config key datasets: wrong type (5); allowed: a list", DATASETS],
    ),
    (
        "datasets-string",
        changed(BASE, datasets="mnist5k"),
        ['config key datasets: wrong type ("mnist5k")'],
    ),
    (
        "lr-string",
        changed(BASE, train__grid__none__lr=["fast"]),
        ['config key train.grid.none.lr[0]: wrong type ("fast"); allowed: a number > 0'],
    ),
    (
        "bias-string",
        changed(BASE, model__bias="yes"),
        ['config key model.bias: wrong type ("yes"); allowed: true or false'],
    ),
    (
        "grid-list",
        changed(BASE, train__grid=["none"]),
        ["config key train.grid: wrong type", "a mapping with keys among none, weight_decay"],
    ),
    (
        "mirror-number",
        changed(BASE, data={"mirrors": {"mnist": 5}}),
        ["config key data.mirrors.mnist: wrong type (5); allowed: a string"],
    ),
    # out of range
    (
        "epochs-negative",
        changed(BASE, train__epochs=-3),
        ["config key train.epochs: out of range (-3); allowed: an integer >= 1"],
    ),
    ("epochs-zero", changed(BASE, train__epochs=0), ["config key train.epochs: out of range (0)"]),
    (
        "certify-rtol-zero",
        changed(BASE, certify__rtol=0),
        ["config key certify.rtol: out of range (0); allowed: a number > 0 and <= 0.5"],
    ),
    (
        "attack-rtol-large",
        changed(BASE, attack__rtol=0.9),
        ["config key attack.rtol: out of range (0.9); allowed: a number > 0 and <= 0.5"],
    ),
    (
        "adv-fraction",
        changed(BASE, train__adv_fraction=1.5),
        ["config key train.adv_fraction: out of range (1.5); allowed: a number > 0 and <= 1"],
    ),
    (
        "dropout-keep-probability-0",
        changed(BASE, train__grid__dropout__keep_hidden=[0.0]),
        [
            "config key train.grid.dropout.keep_hidden[0]: out of range (0.0); "
            "allowed: a number > 0 and <= 1"
        ],
    ),
    (
        "dropout-lambda",
        changed(BASE, train__grid__dropout={"lr": [0.2], "lambda": [0.5]}),
        [
            "config key train.grid.dropout.lambda: not allowed; allowed keys: lr, keep_hidden",
            "config key train.grid.dropout.keep_hidden: missing",
        ],
    ),
    (
        "keep-input-zero",
        changed(BASE, train__keep_input=0),
        ["config key train.keep_input: out of range (0); allowed: a number > 0 and <= 1"],
    ),
    (
        "lr-decay-at-one",
        changed(BASE, train__lr_decay_at=[0.5, 1.0]),
        ["config key train.lr_decay_at[1]: out of range (1.0); allowed: a number > 0 and < 1"],
    ),
    (
        "unknown-init",
        changed(BASE, model__init="xavier"),
        [
            'config key model.init: not an allowed value ("xavier"); '
            "allowed: one of authors, pytorch"
        ],
    ),
    (
        "unknown-certify-models",
        changed(BASE, certify__models="some"),
        ['config key certify.models: not an allowed value ("some"); allowed: one of best, all'],
    ),
    (
        "lambda-negative",
        changed(BASE, train__grid__weight_decay={"lr": [0.1], "lambda": [-1e-4]}),
        ["config key train.grid.weight_decay.lambda[0]: out of range (-0.0001)"],
    ),
    (
        "lr-zero",
        changed(BASE, train__grid__none__lr=[0.2, 0]),
        ["config key train.grid.none.lr[1]: out of range (0); allowed: a number > 0"],
    ),
    ("hidden-zero", changed(BASE, model__hidden=0), ["config key model.hidden: out of range (0)"]),
    (
        "n-points-zero",
        changed(BASE, attack__n_points=0),
        ["config key attack.n_points: out of range (0); allowed: an integer >= 1"],
    ),
    (
        "seed-negative",
        changed(BASE, train__seeds=[-1]),
        ["config key train.seeds[0]: out of range (-1); allowed: an integer >= 0"],
    ),
    (
        "lr-decay-zero",
        changed(BASE, train__lr_decay=0),
        ["config key train.lr_decay: out of range (0)"],
    ),
    # empty and duplicated lists
    (
        "lr-empty",
        changed(BASE, train__grid__none__lr=[]),
        ["config key train.grid.none.lr: empty list ([]); allowed: a list of at least 1 item"],
    ),
    (
        "keep-empty",
        changed(BASE, train__grid__dropout__keep_hidden=[]),
        ["config key train.grid.dropout.keep_hidden: empty list"],
    ),
    (
        "datasets-empty",
        changed(BASE, datasets=[]),
        ["config key datasets: empty list ([])", DATASETS],
    ),
    ("kinds-empty", changed(BASE, certify__kinds=[]), ["config key certify.kinds: empty list"]),
    ("seeds-empty", changed(BASE, train__seeds=[]), ["config key train.seeds: empty list"]),
    (
        "datasets-duplicate",
        changed(BASE, datasets=["mnist5k", "mnist5k"]),
        ["config key datasets: duplicate items"],
    ),
    # unknown names in lists and enums
    (
        "unknown-dataset",
        changed(BASE, datasets=["mnist3"]),
        [
            'config key datasets[0]: not an allowed value ("mnist3")',
            DATASETS,
            "(did you mean mnist?)",
            f"; or {OWN}",
        ],
    ),
    # datasets of your own
    (
        "dataset-number",
        changed(BASE, datasets=[5]),
        [f"config key datasets[0]: wrong type (5); allowed: {DATASETS}, or {OWN}"],
    ),
    (
        "dataset-no-path",
        changed(BASE, datasets=[{"name": "a", "format": "idx"}]),
        ["config key datasets[0].path: missing; it is required: a string"],
    ),
    (
        "dataset-misspelt-key",
        changed(
            BASE, datasets=[{"name": "a", "format": "npz", "path": "a.npz", "sha265": "0" * 64}]
        ),
        [
            "config key datasets[0].sha265: not allowed; allowed keys: name, format, path, sha256, "
            "checksums (did you mean sha256?)"
        ],
    ),
    (
        "dataset-format",
        changed(BASE, datasets=[{"name": "a", "format": "csv", "path": "a"}]),
        [
            'config key datasets[0].format: not an allowed value ("csv"); '
            "allowed: one of idx, npz, folder"
        ],
    ),
    (
        "dataset-name-unsafe",
        changed(BASE, datasets=[{"name": "a/b", "format": "npz", "path": "a"}]),
        ['config key datasets[0].name: not allowed ("a/b")', "letters, digits, _ and -"],
    ),
    (
        "dataset-name-registered",
        changed(BASE, datasets=[{"name": "cifar10", "format": "npz", "path": "a"}]),
        ['config key datasets[0].name: not allowed ("cifar10")', "not a registered name"],
    ),
    (
        "dataset-sha256-short",
        changed(BASE, datasets=[{"name": "a", "format": "npz", "path": "a", "sha256": "abc"}]),
        ['config key datasets[0].sha256: not allowed ("abc"); allowed: a string (64 lowercase hex'],
    ),
    (
        "dataset-sha256-per-file-short",
        changed(
            BASE, datasets=[{"name": "a", "format": "idx", "path": "a", "sha256": {"f.gz": "abc"}}]
        ),
        ['config key datasets[0].sha256.f.gz: not allowed ("abc")'],
    ),
    (
        "dataset-name-twice",
        changed(
            BASE,
            datasets=[
                {"name": "a", "format": "npz", "path": "a"},
                {"name": "A", "format": "idx", "path": "b"},
            ],
        ),
        ["config key datasets[1]: the name 'A' is already used by datasets[0] ('a')"],
    ),
    (
        "dataset-name-registered-case",
        changed(BASE, datasets=[{"name": "Mnist5k", "format": "npz", "path": "a"}]),
        ["config key datasets[0].name: 'Mnist5k' is the registered dataset 'mnist5k'"],
    ),
    (
        "unknown-setting",
        changed(BASE, train__settings=["plain", "rotate"]),
        [
            'config key train.settings[1]: not an allowed value ("rotate"); '
            "allowed: one of plain, augment, adversarial"
        ],
    ),
    (
        "unknown-attack-norm",
        changed(BASE, attack__norms=["l3"]),
        ['config key attack.norms[0]: not an allowed value ("l3"); allowed: one of l2, l1, linf'],
    ),
    (
        "unknown-adv-norm",
        changed(BASE, train__adv_norm="l5"),
        ["config key train.adv_norm: not an allowed value", "one of l1, l2, linf"],
    ),
    (
        "unknown-kind",
        changed(BASE, certify__kinds=["local", "l3"]),
        [
            'config key certify.kinds[1]: not an allowed value ("l3"); '
            "allowed: one of local, global, l2, l1, linf, box, linear, curvature, integrated"
        ],
    ),
    (
        "method-without-norm",
        changed(BASE, certify__kinds=["local", "linear"]),
        ["config key certify.kinds: linear are computed for each requested norm", "add l2"],
    ),
    (
        "unknown-arch",
        changed(BASE, model__arch="cnn"),
        ['config key model.arch: not an allowed value ("cnn"); allowed: one of mlp, resnet'],
    ),
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
    (
        "no-grid",
        changed(BASE, train__grid=DELETE),
        ["config key train.grid: missing; it is required: a mapping with keys among none, "],
    ),
    (
        "no-lambda",
        changed(BASE, train__grid__none__lambda=DELETE),
        ["config key train.grid.none.lambda: missing; it is required: a list"],
    ),
    # YAML 1.1 reads 1e-3 (no dot) as a string
    (
        "yaml-exponent-without-dot",
        yaml.safe_dump(BASE).replace("lr:\n      - 0.2", "lr: [1e-3]"),
        [
            'config key train.grid.dropout.lr[0]: wrong type ("1e-3")',
            "with a dot and a signed exponent",
        ],
    ),
    (
        "yaml-exponent-without-sign",
        yaml.safe_dump(BASE).replace("epochs: 1", "epochs: 1.0e2"),
        ['config key train.epochs: wrong type ("1.0e2")', "1.0e+6"],
    ),
    # Snakemake's --config passes the values inside a mapping as text
    (
        "number-as-text-from-the-command-line",
        changed(BASE, certify__n_points="1000"),
        [
            'config key certify.n_points: wrong type ("1000")',
            "Snakemake's --config passes every value inside a mapping",
            "--configfile",
        ],
    ),
    # consistency checks after the schema (crosslip.config.grid.training_grid)
    (
        "trains-no-model",
        changed(BASE, train__grid={}),
        ["the config trains no model", "train.grid", "kernel.grid"],
    ),
    (
        "none-with-lambda",
        changed(BASE, train__grid__none__lambda=[0.1]),
        ["config key train.grid.none.lambda must be [0.0]"],
    ),
]
#: Bad configs also run through the command line (stderr, exit status, no results folder).
CLI_CASES = ["nested-key-regularizer", "epochs-negative", "results-parent", "trains-no-model"]


def parse(cfg: dict | str) -> tuple[dict, dict]:
    """Validate ``cfg`` (a mapping or YAML text) as the workflow does before planning:
    returns the validated config (defaults filled in) and the training grid."""
    config = yaml.safe_load(cfg) if isinstance(cfg, str) else copy.deepcopy(cfg)
    validate(config)
    return config, training_grid(config)


def test_base_config_is_valid():
    _, grid = parse(BASE)
    assert sorted(grid) == ["dropout-lr0.2-keep0.5-seed0", "none-lr0.2-lam0-seed0"]
    drop = grid["dropout-lr0.2-keep0.5-seed0"]
    assert isinstance(drop, NetTrainSpec)
    assert (drop.keep_hidden, drop.keep_input, drop.lam) == (0.5, 0.9, 0.0)
    assert grid["none-lr0.2-lam0-seed0"].keep_input == 1.0  # input dropout: dropout nets only


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_rejected_naming_key_and_allowed_values(case):
    _, cfg, expected = case
    with pytest.raises(ConfigError) as info:
        parse(cfg)
    msg = str(info.value)
    for text in expected:
        assert text in msg, f"{text!r} not in:\n{msg}"
    assert "Traceback" not in msg


def test_every_problem_of_a_config_is_listed_once():
    cfg = changed(BASE, certfy={}, train__epochs=-1, datasets=["mnist3"])
    with pytest.raises(ConfigError, match=r"invalid config \(3 problems") as info:
        parse(cfg)
    lines = [line for line in str(info.value).splitlines() if line.startswith("config key")]
    assert [line.split(":")[0] for line in lines] == [
        "config key certfy",
        "config key datasets[0]",
        "config key train.epochs",
    ]


def test_defaults_are_filled_in():
    """The validation fills in the schema's defaults, as snakemake's validate(set_default)."""
    minimal = {
        "datasets": ["mnist5k"],
        "train": {"grid": {"none": {"lr": [0.1], "lambda": [0]}}},
        "certify": {},
        "attack": {},
    }
    config, grid = parse(minimal)
    assert config["device"] == "auto" and config["results"] == "results"
    assert config["data"] == {"cache": "results/downloads", "mirrors": {}}
    assert config["model"]["hidden"] == 1024 and config["model"]["arch"] == "mlp"
    assert config["train"]["epochs"] == 200 and config["train"]["settings"] == ["plain"]
    assert config["model"]["bias"] is False and config["model"]["init"] == "authors"
    assert config["train"]["lr_decay_at"] == [0.72, 0.88] and config["train"]["lr_decay"] == 0.1
    assert config["certify"]["kinds"] == [
        *("local", "global", "l2", "l1", "linf", "box"),
        *("linear", "curvature", "integrated"),
    ]
    assert (config["certify"]["tangent_steps"], config["certify"]["integration_nodes"]) == (0, 8)
    assert config["attack"]["refine_steps"] == 5 and config["kernel"]["grid"] == {}
    assert list(grid) == ["none-lr0.1-lam0-seed0"] and grid["none-lr0.1-lam0-seed0"].epochs == 200


@pytest.mark.parametrize(
    "preset",
    [
        "config.yaml",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config" / "presets").glob("*.yaml")),
    ],
)
def test_shipped_configs_are_valid(preset):
    _, grid = parse((ROOT / preset).read_text())
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
# the presets: the authors' settings, and quick.yaml restricting every one of them
# --------------------------------------------------------------------------------------
PRESETS = sorted((ROOT / "config" / "presets").glob("*.yaml"))
NET_PRESETS = [p for p in PRESETS if "kernel" not in p.name]


def test_config_files_merge_as_snakemake_merges_configfiles(tmp_path):
    """Mappings key by key, everything else (lists included) replaced, an empty file adding
    nothing; a file that is not a YAML mapping is named."""
    files = [tmp_path / n for n in ("a.yaml", "b.yaml", "empty.yaml")]
    files[0].write_text("train: {epochs: 3, settings: [plain, augment]}\ndatasets: [mnist]\n")
    files[1].write_text("train: {settings: [plain]}\ncertify: {n_points: 5}\n")
    files[2].write_text("")
    assert merged_files(files) == {
        "train": {"epochs": 3, "settings": ["plain"]},
        "datasets": ["mnist"],
        "certify": {"n_points": 5},
    }
    (tmp_path / "list.yaml").write_text("- 1\n")
    (tmp_path / "bad.yaml").write_text("train: [\n")
    for name, says in [("list", "expected a mapping"), ("bad", "cannot read it as YAML")]:
        with pytest.raises(ConfigError, match=f"config file .*{name}.yaml: {says}"):
            merged_files([files[0], tmp_path / f"{name}.yaml"])


@pytest.mark.parametrize("preset", NET_PRESETS, ids=[p.stem for p in NET_PRESETS])
def test_preset_networks_follow_the_authors_settings(preset):
    """No biases, the authors' initialisation, their schedule, dropout as keep probabilities
    with inputs kept at 0.9, weight decay and Cross-Lipschitz weights from the paper."""
    _, grid = parse(preset.read_text())
    nets = [s for s in grid.values() if isinstance(s, NetTrainSpec)]
    assert nets and all(not s.bias and s.init == "authors" for s in nets)
    assert all(s.lr_decay_at == [0.72, 0.88] and s.lr_decay == 0.1 for s in nets)
    drops = [s for s in nets if s.regularizer == "dropout"]
    assert drops and all(s.keep_input == 0.9 and s.lam == 0 for s in drops)
    assert {s.keep_hidden for s in drops} <= {0.4, 0.5, 0.6, 0.7, 0.8}
    assert all(s.keep_input == 1 for s in nets if s.regularizer != "dropout")


def test_mnist_preset_is_the_papers_grid():
    _, grid = parse((ROOT / "config" / "presets" / "mnist.yaml").read_text())
    plain = [s for s in grid.values() if s.setting == "plain"]
    by_reg = {
        r: sorted({s.hyperparameter for s in plain if s.regularizer == r})
        for r in ("weight_decay", "cross_lipschitz", "dropout")
    }
    assert by_reg == {
        "weight_decay": [1e-5, 1e-4, 1e-3, 1e-2],
        "cross_lipschitz": [1e-5, 1e-4, 5e-4, 1e-3],
        "dropout": [0.4, 0.5, 0.6, 0.7],
    }
    assert {s.lr for s in plain} == {0.2, 0.5} and len(grid) == 78


@pytest.mark.parametrize("preset", NET_PRESETS, ids=[p.stem for p in NET_PRESETS])
def test_quick_override_keeps_one_model_per_regularizer_and_setting(preset):
    config = merged_files([preset, ROOT / "config" / "overrides" / "quick.yaml"])
    _, grid = parse(config)
    nets = [s for s in grid.values() if isinstance(s, NetTrainSpec)]
    pairs = [(s.setting, s.regularizer) for s in nets]
    assert len(pairs) == len(set(pairs)) == 4 * len(config["train"].get("settings", ["plain"]))
    assert all(s.epochs == 3 for s in nets)
    # kernel models (mnist_illustration) keep their grid, on fewer expansion points
    assert all(s.n_centers == 1000 for s in grid.values() if isinstance(s, KernelTrainSpec))


@pytest.mark.slow
def test_quick_override_dry_run_lists_one_model_per_regularizer_and_setting(tmp_path):
    """Through Snakemake itself (its own merge of two --configfile files)."""
    for preset in NET_PRESETS:
        work = tmp_path / preset.stem
        work.mkdir()
        proc = run_snakemake(
            snakemake_cmd(
                work,
                "-n",
                "--configfile",
                str(preset),
                str(ROOT / "config" / "overrides" / "quick.yaml"),
            ),
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        trained = trained_models(dry_run_jobs(proc.stdout))
        nets = [m for m in trained if not m.startswith("kernel_")]
        settings = yaml.safe_load(preset.read_text())["train"].get("settings", ["plain"])
        assert len(nets) == len(set(nets)) == 4 * len(settings), (preset.name, len(nets))


# --------------------------------------------------------------------------------------
# one source: every key described, the reference generated from it
# --------------------------------------------------------------------------------------
def _keys(node, root, path=""):
    from crosslip.config.schema import _resolve

    node = _resolve(node, root)
    for name, sub in node.get("properties", {}).items():
        key = f"{path}.{name}" if path else name
        yield key, _resolve(sub, root)
        yield from _keys(sub, root, key)


def test_every_schema_key_has_a_description():
    root = load_schema()
    nodes = list(_keys(root, root))
    for name in root["$defs"]:
        nodes += list(_keys(root["$defs"][name], root, f"$defs.{name}"))
    missing = [k for k, node in nodes if not node.get("description")]
    assert len(nodes) > 60 and missing == []


def test_configuration_reference_is_generated_from_the_schema():
    """docs/configuration.md is `python -m crosslip.config`'s output (regenerate it after a
    schema change) and lists every key."""
    from crosslip.config.reference import reference_markdown

    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == reference_markdown()
    root = load_schema()
    for key, _ in _keys(root, root):
        assert f"| `{key}` |" in committed


def test_spec_defaults_are_the_schema_defaults():
    from crosslip.config.schema import default
    from crosslip.config.specs import KernelTrainSpec

    spec, kern = NetTrainSpec(), KernelTrainSpec()
    assert spec.epochs == default("train.epochs") and spec.bias is default("model.bias")
    assert spec.lr_decay_at == default("train.lr_decay_at") and spec.init == default("model.init")
    assert kern.n_centers == default("kernel.n_centers")


def test_certification_settings_are_one_object_with_the_schemas_defaults():
    """The certify rule's params are the settings' fields, whose defaults are the
    schema's; the library's entry points default to them (the trust region on)."""
    import dataclasses
    import inspect

    from crosslip.certify import certify, certify_softplus
    from crosslip.certify.settings import DEFAULT_SETTINGS, CertifySettings
    from crosslip.config.schema import default
    from crosslip.jobs.batches import EVALUATION_PARAMS

    names = [f.name for f in dataclasses.fields(CertifySettings)]
    assert sorted(names) == sorted(EVALUATION_PARAMS["certify"])
    for name, key in EVALUATION_PARAMS["certify"].items():
        want = default(key)
        got = getattr(DEFAULT_SETTINGS, name)
        assert (tuple(want) if isinstance(want, list) else want) == got, name
    assert DEFAULT_SETTINGS.trust_region_steps > 0
    for fn in (certify, certify_softplus):  # no default of their own
        params = inspect.signature(fn).parameters
        assert "trust_region_steps" not in params and "rtol" not in params
    with pytest.raises(TypeError, match="rtl"):
        DEFAULT_SETTINGS.but(rtl=1e-3)

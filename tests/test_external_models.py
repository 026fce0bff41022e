"""Models trained elsewhere: loading without running code, config checks, the import stage,
and the whole workflow on a state dict, a kernel .npz, a TorchScript module and an exported
program (.pt2; its own checks: test_exported_models.py)."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from torch import nn

from crosslip.certify import certify
from crosslip.config.grid import aggregate_targets
from crosslip.config.schema import default
from crosslip.config.validate import validate
from crosslip.data import load_prepared
from crosslip.errors import ConfigError, ModelFileError
from crosslip.io.files import read_json
from crosslip.models.external import load_external, load_stored
from crosslip.models.kernels import GaussianKernelModel
from crosslip.models.torch_softplus import TORCH_BETA, TORCH_THRESHOLD, TorchSoftplusNet
from crosslip.pipeline import attack_stage, certify_stage, import_model_stage, prepare_data

from .helpers import run_snakemake, snakemake_cmd
from .test_custom_data import H, K, W, npz_arrays, sha256, write_npz
from .test_untrusted_files import payloads
from .workflow_helpers import THREADS, files_under, offline_env

D = H * W * 3  # the .npz dataset of test_custom_data: colour images, channels last


def user_net(beta: float = 10.0, bias: bool = True, h: int = 9, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(D, h, bias=bias), nn.Softplus(beta), nn.Linear(h, K, bias=bias)
    )


class Scorer(nn.Module):
    """Any other network (attacks only)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Linear(D, 5)
        self.out = nn.Linear(5, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.conv(x)))


def kernel_arrays(n: int = 7, seed: int = 0) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    return {
        "centers": g.random((n, D)),
        "coef": g.normal(size=(K, n)),
        "gamma": np.float64(0.05),
    }


def write_models(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "state": folder / "mynet.pt",
        "kernel": folder / "mykernel.npz",
        "script": folder / "scorer.pt",
    }
    torch.save(user_net().state_dict(), paths["state"])
    np.savez(paths["kernel"], **kernel_arrays())
    torch.manual_seed(1)
    torch.jit.save(torch.jit.script(Scorer()), str(paths["script"]))
    return paths


def entry(path: Path, name: str = "m", **more) -> dict:
    return {"name": name, "dataset": "scans", "path": str(path), **more}


# --------------------------------------------------------------------------------------
# loading: the three formats, and every refusal
# --------------------------------------------------------------------------------------
def test_the_three_formats_load_as_what_they_compute(tmp_path):
    paths = write_models(tmp_path)
    x = torch.rand(5, D)
    net = load_external(entry(paths["state"], beta=10.0, threshold=20.0))
    assert isinstance(net, TorchSoftplusNet)
    with torch.no_grad():
        assert torch.equal(net(x), user_net()(x))
    kern = load_external(entry(paths["kernel"]))
    assert isinstance(kern, GaussianKernelModel) and kern.gamma == 0.05
    script = load_external(entry(paths["script"], format="torchscript"))
    torch.manual_seed(1)
    with torch.no_grad():
        assert torch.allclose(script(x), Scorer()(x))


def test_beta_and_threshold_come_from_the_entry(tmp_path):
    path = tmp_path / "m.pt"
    torch.save(user_net(beta=37.5).state_dict(), path)
    net = load_external(entry(path, beta=37.5, threshold=3.0))
    assert (net.alpha, net.threshold) == (37.5, 3.0)
    seq = user_net(beta=37.5)
    seq[2].threshold = 3.0
    x = torch.rand(4, D)
    with torch.no_grad():
        assert torch.equal(net(x), seq(x))


def refusal(tmp_path: Path, name: str) -> Path:
    """A file that must be refused when given as a state dict."""
    path = tmp_path / f"{name}.pt"
    marker = tmp_path / "marker"
    if name == "full_module":
        torch.save(user_net(), path)
    elif name == "pickle_with_objects":
        torch.save({"0.weight": payloads(marker)["os.system"]}, path)
    elif name == "plain_pickle":
        path.write_bytes(pickle.dumps({"0.weight": payloads(marker)["builtins.exec"]}))
    elif name == "torchscript":
        torch.jit.save(torch.jit.script(user_net()), str(path))
    elif name == "garbage":
        path.write_bytes(b"\x89garbage bytes, not a model" * 10)
    elif name == "empty":
        path.write_bytes(b"")
    elif name == "nested":
        torch.save({"model": user_net().state_dict()}, path)
    elif name == "tensor":
        torch.save(torch.ones(3), path)
    elif name == "wrong_keys":
        torch.save({"fc.weight": torch.ones(3, 3)}, path)
    return path


@pytest.mark.parametrize(
    "name,message",
    [
        ("full_module", "refused to load .*save model.state_dict"),
        ("pickle_with_objects", "refused to load .*may contain code"),
        ("plain_pickle", "refused to load|not a readable PyTorch file"),
        ("torchscript", "a TorchScript archive, not a state dict; .*format: torchscript"),
        ("garbage", "refused to load|not a readable PyTorch file"),
        ("empty", "not a readable PyTorch file"),
        ("nested", "not a flat state dict of tensors"),
        ("tensor", "holds a Tensor, not a state dict"),
        ("wrong_keys", r"keys \{fc.weight\} are not those of a supported network"),
    ],
)
def test_files_that_are_not_plain_tensors_are_refused_with_the_file_named(tmp_path, name, message):
    path = refusal(tmp_path, name)
    with pytest.raises(ModelFileError, match=message) as info:
        load_external(entry(path))
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "marker").exists()  # nothing ran


def test_bad_kernel_npz_files_are_refused(tmp_path):
    good = kernel_arrays()
    cases = {
        "objects": {**good, "coef": np.array([{"a": 1}], dtype=object)},
        "missing": {k: v for k, v in good.items() if k != "gamma"},
        "shapes": {**good, "coef": np.ones((K, 3))},
        "gamma": {**good, "gamma": np.float64(-1.0)},
        "nan": {**good, "centers": np.full((7, D), np.nan)},
    }
    messages = {
        "objects": "holds Python objects",
        "missing": r"missing arrays \['gamma'\]",
        "shapes": "do not fit",
        "gamma": "gamma must be one positive number",
        "nan": "NaN",
    }
    for name, arrays in cases.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        with pytest.raises(ModelFileError, match=messages[name]) as info:
            load_external(entry(path))
        assert str(path) in str(info.value)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(ModelFileError, match=r"not a readable \.npz"):
        load_external(entry(garbage))


def test_torchscript_format_needs_a_torchscript_file_and_checksums_are_verified(tmp_path):
    paths = write_models(tmp_path)
    with pytest.raises(ModelFileError, match="not a TorchScript archive"):
        load_external(entry(paths["state"], format="torchscript"))
    with pytest.raises(ModelFileError, match="SHA-256 mismatch"):
        load_external(entry(paths["state"], sha256="0" * 64))
    load_external(entry(paths["state"], sha256=sha256(paths["state"])))


# --------------------------------------------------------------------------------------
# the config
# --------------------------------------------------------------------------------------
def config(tmp_path: Path, models: list[dict], grid: dict | None = None) -> dict:
    return {
        "datasets": [{"name": "scans", "format": "npz", "path": str(tmp_path / "scans.npz")}],
        "external_models": models,
        "train": {"grid": grid or {}},
        "certify": {"n_points": 3},
        "attack": {"n_points": 3},
    }


def test_a_config_of_external_models_only_is_valid_and_lists_their_figure(tmp_path):
    paths = write_models(tmp_path)
    cfg = validate(config(tmp_path, [entry(paths["state"], "mynet")]))
    assert cfg["external_models"][0]["beta"] == 1.0  # the schema's default: PyTorch's
    targets = aggregate_targets(cfg)
    assert "results/figures/bounds_vs_error/scans-external.png" in targets
    assert "results/tables/summary.csv" in targets
    assert not any("training/" in t or "table1" in t for t in targets)
    with pytest.raises(ConfigError, match=r"trains no model.*or list external_models"):
        validate(config(tmp_path, []))


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(dataset="digits"), r"external_models\[0\].dataset: 'digits' is not one of"),
        (dict(path="nowhere.pt"), r"external_models\[0\].path: nowhere.pt not found"),
        (dict(name="my net"), r"external_models\[0\].name: not allowed"),
        (dict(format="onnx"), r"external_models\[0\].format: not an allowed value"),
        (dict(beta=0), r"external_models\[0\].beta: out of range"),
        (dict(colour="red"), r"external_models\[0\].colour: not allowed"),
        (dict(name="none-lr1-lam0-seed0"), r"is the id of a model this config trains"),
    ],
)
def test_bad_entries_are_named_by_their_key(tmp_path, change, message):
    paths = write_models(tmp_path)
    grid = {"none": {"lr": [1.0], "lambda": [0.0]}}
    with pytest.raises(ConfigError, match=message):
        validate(config(tmp_path, [{**entry(paths["state"], "mynet"), **change}], grid))


def test_duplicate_names_and_unknown_endings_are_refused(tmp_path):
    paths = write_models(tmp_path)
    two = [entry(paths["state"], "MyNet"), entry(paths["kernel"], "mynet")]
    with pytest.raises(ConfigError, match=r"external_models\[1\].name: 'mynet' is already"):
        validate(config(tmp_path, two))
    odd = tmp_path / "model.bin"
    odd.write_bytes(paths["state"].read_bytes())
    with pytest.raises(ConfigError, match=r"external_models\[0\].format: missing, and the ending"):
        validate(config(tmp_path, [entry(odd, "x")]))
    validate(config(tmp_path, [entry(odd, "x", format="state_dict")]))


def test_softplus_settings_on_a_kernel_or_torchscript_model_are_refused(tmp_path):
    """beta and threshold configure a state dict's nn.Softplus; stated on a model without
    one they would silently do nothing."""
    paths = write_models(tmp_path)
    for path, fmt, given in (
        (paths["kernel"], {}, {"beta": 10.0}),
        (paths["script"], {"format": "torchscript"}, {"threshold": 30.0}),
        (paths["script"], {"format": "torchscript"}, {"beta": 2.0, "threshold": 30.0}),
    ):
        models = [entry(paths["state"], "ok", beta=10.0), entry(path, "other", **fmt, **given)]
        first = sorted(given)[0]
        with pytest.raises(ConfigError, match=rf"external_models\[1\]\.{first}: .* has none to"):
            validate(config(tmp_path, models))
    cfg = validate(config(tmp_path, [entry(paths["kernel"], "k"), entry(paths["state"], "n")]))
    assert [m.get("beta") for m in cfg["external_models"]] == [1.0, 1.0]  # defaults: no error


# --------------------------------------------------------------------------------------
# the stages
# --------------------------------------------------------------------------------------
def prepared_scans(tmp_path: Path) -> Path:
    """The colour-image .npz dataset of test_custom_data, prepared in ``tmp_path``."""
    write_npz(tmp_path / "scans.npz", **npz_arrays())
    out = tmp_path / "scans-prepared.npz"
    prepare_data(
        "scans", out, "", None, source=entry(tmp_path / "scans.npz", "scans", format="npz")
    )
    return out


@pytest.fixture
def scans(tmp_path) -> Path:
    return prepared_scans(tmp_path)


def test_a_crosslip_model_file_is_certified_as_the_model_it_holds(tmp_path, scans):
    """format: crosslip (a model file crosslip wrote, e.g. a committed run's weights): the
    import holds the same network, and its certificates are those of that network."""
    from crosslip.certify import certify_softplus
    from crosslip.models import SoftplusNet
    from crosslip.models.checkpoints import save_model

    torch.manual_seed(3)
    net = SoftplusNet(D, K, 8, bias=True).double().eval()
    path = tmp_path / "trained.pt"
    save_model(net, path)
    loaded = load_external(entry(path, format="crosslip"))
    assert isinstance(loaded, SoftplusNet)
    for a, b in zip(loaded.state_dict().values(), net.state_dict().values(), strict=True):
        assert torch.equal(a.double(), b)
    model_out, met_out = tmp_path / "imp" / "model.pt", tmp_path / "imp" / "metrics.json"
    met = import_model_stage(scans, entry(path, "mine", format="crosslip"), model_out, met_out)
    assert met["config"]["family"] == "external" and "prop2.3" in met["config"]["guarantees"]
    kinds = ["l2", "linear", "curvature"]
    cert = certify_stage(scans, model_out, met_out, tmp_path / "c.parquet", n_points=5, kinds=kinds)
    x = torch.as_tensor(load_prepared(scans).x_test, dtype=torch.float64)
    idx = torch.as_tensor(cert["test_index"].to_numpy())
    direct = certify_softplus(net, x[idx], kinds=tuple(kinds))
    for col in ("guarantee_l2", "guarantee_l2_curvature", "guarantee_l2_best"):
        np.testing.assert_array_equal(cert[col].to_numpy(), direct[col].numpy(), err_msg=col)


def test_import_certify_and_attack_stages(tmp_path, scans):
    paths = write_models(tmp_path)
    ds = load_prepared(scans)
    kinds = ["local", "global", "l2", "l1", "linf", "box"]
    rows = {}
    for key, ent in (
        ("state", entry(paths["state"], "mynet", beta=10.0, threshold=20.0)),
        ("kernel", entry(paths["kernel"], "mykernel")),
        ("script", entry(paths["script"], "scorer", format="torchscript")),
    ):
        model_out, met_out = tmp_path / key / "model.pt", tmp_path / key / "metrics.json"
        met = import_model_stage(scans, ent, model_out, met_out)
        assert read_json(met_out) == met and met["config"]["family"] == "external"
        model = load_stored(model_out, ent.get("format"))
        with torch.no_grad():
            logits = model.double()(torch.as_tensor(ds.x_test, dtype=torch.float64))
        assert met["test_error"] == float((logits.argmax(1).numpy() != ds.y_test).mean())
        cert = certify_stage(
            scans, model_out, met_out, tmp_path / f"{key}-c.parquet", n_points=6, kinds=kinds
        )
        att = attack_stage(
            scans, model_out, met_out, tmp_path / f"{key}-a.parquet", n_points=6, max_steps=20
        )
        rows[key] = cert.merge(att, on="test_index")
    assert (rows["state"]["local_bound"] == "prop2.3").all()
    assert (rows["kernel"]["local_bound"] == "prop2.2").all()
    assert (rows["script"]["local_bound"] == "none").all()
    guarantees = [c for c in rows["state"] if c.startswith("guarantee_")]
    assert rows["script"][guarantees].isna().all().all()  # null, not 0: no guarantee
    assert rows["script"]["upper_bound"].notna().any()  # but upper bounds
    assert rows["state"]["guarantee_l2"].notna().all()
    assert rows["kernel"]["guarantee_local"].notna().all()
    for key in ("state", "kernel"):
        r = rows[key]
        assert (r["guarantee_local"] <= r["upper_bound"].fillna(np.inf) + 1e-9).all()


def test_a_model_that_does_not_fit_its_dataset_is_refused_and_nothing_written(tmp_path, scans):
    path = tmp_path / "small.pt"
    torch.save(nn.Sequential(nn.Linear(4, 3), nn.Softplus(), nn.Linear(3, K)).state_dict(), path)
    with pytest.raises(ModelFileError, match=f"{path}: the model maps 4 inputs to 3 classes"):
        import_model_stage(
            scans, entry(path), tmp_path / "o" / "model.pt", tmp_path / "o" / "m.json"
        )
    scripted = tmp_path / "bad.pt"
    torch.jit.save(torch.jit.script(nn.Linear(D, K + 1)), str(scripted))
    with pytest.raises(ModelFileError, match=r"scores of shape \(4,\) per image"):
        import_model_stage(
            scans,
            entry(scripted, format="torchscript"),
            tmp_path / "o" / "model.pt",
            tmp_path / "o" / "m.json",
        )
    assert files_under(tmp_path / "o") == []


def test_library_call_certifies_the_users_sequential_directly():
    net = user_net(beta=37.5, h=5)
    x = torch.rand(3, D)
    cert = certify(net, x, kinds=("l2",))
    assert cert.local_bound == "prop2.3" and (cert.columns["guarantee_l2"] > 0).all()


# --------------------------------------------------------------------------------------
# the workflow
# --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_workflow_certifies_models_trained_elsewhere(tmp_path, monkeypatch):
    write_npz(tmp_path / "in" / "scans.npz", **npz_arrays())
    paths = write_models(tmp_path / "models")
    cfg = {
        "datasets": [{"name": "scans", "format": "npz", "path": "in/scans.npz"}],
        "external_models": [
            {"name": "mynet", "dataset": "scans", "path": "models/mynet.pt", "beta": 10.0},
            {"name": "mykernel", "dataset": "scans", "path": str(paths["kernel"])},
            {
                "name": "scorer",
                "dataset": "scans",
                "path": "models/scorer.pt",
                "format": "torchscript",
                "sha256": sha256(paths["script"]),
            },
            {"name": "exported", "dataset": "scans", "path": "models/exported.pt2"},
        ],
        "train": {"grid": {}},
        "certify": {"n_points": 4, "kinds": ["local", "global", "l2"]},
        "attack": {"n_points": 4, "norms": ["l2"], "refine_steps": 0, "n_examples": 1},
    }
    torch.manual_seed(2)  # any other classifier, exported with a fixed batch size
    program = torch.export.export(Scorer(), (torch.rand(3, D),))
    torch.export.save(program, tmp_path / "models" / "exported.pt2")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = snakemake_cmd(tmp_path, "--cores", "2", configfile=tmp_path / "config.yaml") + THREADS
    t0 = time.perf_counter()
    proc = run_snakemake(cmd, timeout=1200, env=offline_env())
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    res = tmp_path / "results"
    inst = pd.concat(pd.read_parquet(p) for p in sorted((res / "instances").rglob("*.parquet")))
    assert set(inst["family"]) == {"external"} and len(inst) == 4 * 4
    by = inst.groupby("model_id")
    assert dict(by["local_bound"].first()) == {
        "exported": "none",
        "mykernel": "prop2.2",
        "mynet": "prop2.3",
        "scorer": "none",
    }
    for name in ("scorer", "exported"):  # upper bounds, no guarantee
        other = inst[inst["model_id"] == name]
        assert other["guarantee_local"].isna().all() and other["guarantee_l2"].isna().all()
        assert other["upper_bound"].notna().any()
    net = inst[inst["model_id"] == "mynet"]
    assert net["guarantee_l2"].notna().all() and (net["guarantee_l2"] > 0).any()
    ok = inst[inst["correct"]]
    assert (ok["guarantee_local"].fillna(0) <= ok["upper_bound"].fillna(np.inf) + 1e-9).all()
    summary = pd.read_csv(res / "tables" / "summary.csv")
    assert sorted(summary["model_id"]) == ["exported", "mykernel", "mynet", "scorer"]
    assert set(summary["family"]) == {"external"} and set(summary["seed"]) == {-1}
    monkeypatch.chdir(tmp_path)  # the config's relative paths
    for target in aggregate_targets(validate(cfg)):
        assert (tmp_path / target).is_file(), target
    assert not (res / "tables" / "table1_global_local.csv").exists()
    print(f"workflow on four external models: {seconds:.1f} s")
    # a changed model file is imported (and evaluated) again, nothing else
    torch.save(user_net(seed=5).state_dict(), paths["state"])
    again = run_snakemake([*cmd, "-n"], env=offline_env())
    assert "import_model" in again.stdout and "prepare_data" not in again.stdout


def test_softplus_defaults_are_pytorchs_in_the_schema_and_the_loader():
    """A state dict does not store its nn.Softplus's beta and threshold: the schema's defaults
    and the loader's fallback (for an entry that did not pass through the config) must both
    be what nn.Softplus() uses, or a model would be certified as another function."""
    plain = nn.Softplus()
    assert (plain.beta, plain.threshold) == (TORCH_BETA, TORCH_THRESHOLD)
    assert default("$defs.external_model.beta") == TORCH_BETA
    assert default("$defs.external_model.threshold") == TORCH_THRESHOLD

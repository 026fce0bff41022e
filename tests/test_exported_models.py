"""Models saved with torch.export (.pt2): a softplus graph gets the guarantees of its state
dict, any other classifier gets upper bounds, and archives that would run code when read
(pickled weights, constants or sample inputs, compiled AOTInductor parts) are refused
without running it."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from crosslip.config.validate import external_models, validate
from crosslip.errors import ConfigError, ModelFileError
from crosslip.io.files import read_json
from crosslip.models.exported import ExportedClassifier, load_exported, vet_archive
from crosslip.models.external import load_external, load_stored
from crosslip.models.torch_softplus import TorchSoftplusNet
from crosslip.pipeline import attack_stage, certify_stage, import_model_stage

from .test_external_models import D, K, Scorer, config, entry, prepared_scans, user_net
from .test_untrusted_files import payloads
from .workflow_helpers import files_under


@pytest.fixture
def scans(tmp_path) -> Path:
    return prepared_scans(tmp_path)


KINDS = ["local", "global", "l2", "l1", "linf", "box", "linear", "curvature"]


def export(model: nn.Module, path: Path, batch: int = 3, dynamic: bool = True) -> Path:
    """``torch.export.save`` of ``model`` on (batch, D) inputs, the batch size dynamic or
    fixed: the three lines of docs/your-own-models.md."""
    shapes = ({0: torch.export.Dim("batch")},) if dynamic else None
    program = torch.export.export(model, (torch.rand(batch, D),), dynamic_shapes=shapes)
    torch.export.save(program, path)
    return path


def rewrite(src: Path, dst: Path, change) -> Path:
    """A copy of the archive ``src`` with ``change(name, bytes) -> bytes | None`` applied
    to each member (None drops it), plus the members ``change.extra`` (name -> bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/", 1)[0]
        for info in zin.infolist():
            data = change(info.filename[len(root) + 1 :], zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
        for name, data in getattr(change, "extra", {}).items():
            zout.writestr(f"{root}/{name}", data)
    return dst


def test_an_exported_softplus_net_is_certified_as_its_state_dict(tmp_path, scans):
    net = user_net(beta=37.5, h=6)
    net[2].threshold = 3.0  # small: the certificate must account for PyTorch's switch
    path = export(net, tmp_path / "mynet.pt2")
    torch.save(net.state_dict(), tmp_path / "mynet.pt")
    model = load_external(entry(path))
    assert isinstance(model, TorchSoftplusNet)
    assert (model.alpha, model.threshold) == (37.5, 3.0)  # from the graph, not the entry
    x = torch.rand(5, D)
    with torch.no_grad():
        assert torch.equal(model(x), net(x))
    rows = {}
    for name, ent in (
        ("exported", entry(path, "exp")),
        ("state", entry(tmp_path / "mynet.pt", "sd", beta=37.5, threshold=3.0)),
    ):
        out = tmp_path / name
        met = import_model_stage(scans, ent, out / "model.pt", out / "metrics.json")
        assert met["config"]["guarantees"].startswith("prop2.3")
        rows[name] = certify_stage(
            scans,
            out / "model.pt",
            out / "metrics.json",
            out / "c.parquet",
            n_points=8,
            kinds=KINDS,
        )
    a, b = rows["exported"], rows["state"]
    guarantees = [c for c in a if c.startswith("guarantee_")]
    assert len(guarantees) > 10 and a["guarantee_l2"].notna().all()
    pd.testing.assert_frame_equal(a[guarantees], b[guarantees])


@pytest.mark.parametrize("dynamic", [True, False])
def test_any_other_exported_classifier_gets_upper_bounds_only(tmp_path, scans, dynamic):
    torch.manual_seed(1)
    scorer = Scorer()
    path = export(scorer, tmp_path / "scorer.pt2", batch=3, dynamic=dynamic)
    model = load_external(entry(path))
    assert isinstance(model, ExportedClassifier)
    assert model.hyper == {"in_dim": D, "num_classes": K}
    for n in (1, 2, 3, 7):  # a fixed batch size of 3 is split and padded
        x = torch.rand(n, D)
        with torch.no_grad():
            assert torch.allclose(model(x), scorer(x))
    out = tmp_path / "out"
    met = import_model_stage(scans, entry(path, "scorer"), out / "model.pt", out / "m.json")
    assert met["config"]["guarantees"] == "none (upper bounds only)"
    assert zipfile.is_zipfile(out / "model.pt")  # the archive itself, vetted again on load
    assert isinstance(load_stored(out / "model.pt", "torch_export"), ExportedClassifier)
    cert = certify_stage(
        scans, out / "model.pt", out / "m.json", out / "c.parquet", n_points=6, kinds=KINDS
    )
    att = attack_stage(
        scans, out / "model.pt", out / "m.json", out / "a.parquet", n_points=6, max_steps=20
    )
    assert (cert["local_bound"] == "none").all()
    guarantees = [c for c in cert if c.startswith("guarantee_") and c != "guarantee_l2_method"]
    assert cert[guarantees].isna().all().all()  # null, not 0: no guarantee
    assert att["upper_bound"].notna().all() and (att["upper_bound"] > 0).all()


def evil_weight(marker: Path):
    """A change for :func:`rewrite`: the first weight stored as a pickle that runs code."""
    payload = io.BytesIO()
    torch.save(payloads(marker)["os.system"], payload)

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("_weights_config.json"):
            cfg = json.loads(data)
            first = next(iter(cfg["config"].values()))
            first["use_pickle"] = True
            return json.dumps(cfg).encode()
        if name == "data/weights/weight_0":
            return payload.getvalue()
        return data

    return change


def evil_sample(marker: Path):
    def change(name: str, data: bytes) -> bytes:
        if name.startswith("data/sample_inputs/"):
            return pickle.dumps(payloads(marker)["builtins.exec"])
        return data

    return change


def with_extra(members: dict[str, bytes]):
    def change(name: str, data: bytes) -> bytes:
        return data

    change.extra = members
    return change


@pytest.mark.parametrize(
    "case,message",
    [
        ("pickled_weight", "stored as a pickled object"),
        ("pickled_sample", "sample inputs are not plain tensors"),
        ("aoti", "holds data/aotinductor/model/model.so: only the graph and plain tensors"),
        ("legacy_weights", "holds data/weights/model.pt"),
        ("no_graph", "missing models/model.json"),
        ("garbage", "not a torch.export archive"),
        ("state_dict", "not a torch.export archive"),
    ],
)
def test_archives_that_would_run_code_or_are_not_pt2_are_refused(tmp_path, case, message):
    good = export(user_net(), tmp_path / "good.pt2")
    marker = tmp_path / "marker"
    path = tmp_path / "bad.pt2"
    if case == "pickled_weight":
        rewrite(good, path, evil_weight(marker))
    elif case == "pickled_sample":
        rewrite(good, path, evil_sample(marker))
    elif case == "aoti":
        rewrite(good, path, with_extra({"data/aotinductor/model/model.so": b"\x7fELF"}))
    elif case == "legacy_weights":
        rewrite(good, path, with_extra({"data/weights/model.pt": b"PK"}))
    elif case == "no_graph":
        rewrite(good, path, lambda name, data: None if name.startswith("models/") else data)
    elif case == "garbage":
        path.write_bytes(b"PK\x03\x04 not really a zip" * 20)
    else:
        torch.save(user_net().state_dict(), path)
    for load in (vet_archive, load_exported, lambda p: load_external(entry(p))):
        with pytest.raises(ModelFileError, match=message) as info:
            load(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert not marker.exists()  # nothing ran
    if case == "pickled_weight":  # torch.export.load itself would have run it
        shutil.copy(path, tmp_path / "direct.pt2")
        try:
            torch.export.load(tmp_path / "direct.pt2")
        except Exception:
            pass
        assert marker.exists()


def test_formats_and_endings_of_exported_models(tmp_path, scans):
    good = export(user_net(), tmp_path / "net.pt2")
    with pytest.raises(ModelFileError, match=r"a torch.export archive \(.pt2\), not a state dict"):
        load_external(entry(good, format="state_dict"))
    cfg = validate(config(tmp_path, [entry(good, "n")]))
    assert external_models(cfg)["n"]["format"] == "torch_export"  # implied by .pt2
    with pytest.raises(ConfigError, match=r"\.beta: .*none to configure \(its graph states"):
        validate(config(tmp_path, [entry(good, "n", beta=2.0)]))
    small = export(
        nn.Sequential(nn.Linear(D, 3), nn.Softplus(), nn.Linear(3, K + 2)), tmp_path / "s.pt2"
    )
    with pytest.raises(ModelFileError, match=f"{small}: the model maps {D} inputs to {K + 2}"):
        import_model_stage(scans, entry(small), tmp_path / "o" / "model.pt", tmp_path / "o" / "m")
    assert files_under(tmp_path / "o") == []
    met = import_model_stage(
        scans, entry(good, "n"), tmp_path / "ok" / "model.pt", tmp_path / "ok" / "m"
    )
    assert (
        read_json(tmp_path / "ok" / "m") == met and met["config"]["beta"] == 10.0
    )  # from the graph

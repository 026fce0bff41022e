"""``crosslip.certify.certify``: the bounds follow the model's kind, the columns are those of
the kind's own certifier, and the model is left as it was."""

from __future__ import annotations

import torch
from torch import nn

from crosslip.certify import Certification, certify, certify_kernel, certify_model, certify_softplus
from crosslip.models import SoftplusNet
from crosslip.models.kernels import GaussianKernelModel
from crosslip.models.resnet import ResNet

from .helpers import random_net


def assert_same_columns(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)


def test_softplus_net_gets_every_requested_kind_of_proposition_23():
    net, x = random_net(5, 3, 7, seed=1, scale=3.0), torch.rand(9, 5, dtype=torch.float64)
    cert = certify(net, x, kinds=("local", "l1", "box"), rtol=1e-4)
    assert isinstance(cert, Certification) and cert.local_bound == "prop2.3"
    assert_same_columns(
        cert.columns, certify_softplus(net, x, rtol=1e-4, kinds=("local", "l1", "box"))
    )
    assert {"guarantee_local", "guarantee_l1", "guarantee_l1_box"} <= set(cert.columns)
    assert "guarantee_l2" not in cert.columns and "guarantee_linf" not in cert.columns


def test_softplus_net_without_local_kind_has_no_local_bound_label():
    net, x = random_net(4, 3, 6, seed=2), torch.rand(5, 4, dtype=torch.float64)
    cert = certify(net, x, kinds=("global",))
    assert cert.local_bound is None and "guarantee_local" not in cert.columns
    assert cert.columns["guarantee_global"].shape == (5,)


def test_a_subclass_of_a_known_kind_gets_that_kind_of_bounds():
    class MyNet(SoftplusNet):
        pass

    net = MyNet(4, 3, hidden=5).double()
    x = torch.rand(4, 4, dtype=torch.float64)
    cert = certify(net, x, kinds=("local",))
    assert cert.local_bound == "prop2.3"
    assert_same_columns(cert.columns, certify_softplus(net, x, kinds=("local",)))


def test_kernel_model_gets_proposition_22_also_as_its_l2_guarantee():
    g = torch.Generator().manual_seed(0)
    model = GaussianKernelModel(torch.rand(12, 4, generator=g), 3, gamma=2.0)
    with torch.no_grad():
        model.coef.copy_(torch.randn(3, 12, generator=g))
    x = torch.rand(6, 4, generator=g)
    cert = certify(model, x, kinds=("local", "l2"), rtol=1e-3)
    assert cert.local_bound == "prop2.2"
    want = certify_kernel(model, x, rtol=1e-3)
    assert_same_columns({k: v for k, v in cert.columns.items() if k != "guarantee_l2"}, want)
    torch.testing.assert_close(cert.columns["guarantee_l2"], want["guarantee_local"])
    assert (cert.columns["guarantee_local"] > 0).any()  # not an empty certificate


def test_other_networks_get_prediction_and_margin_only_and_stay_unchanged():
    torch.manual_seed(0)
    net = ResNet((6, 6, 1), num_classes=4, n=1).eval()
    x = torch.rand(300, 36)  # more than one batch of 256
    before = {k: v.clone() for k, v in net.state_dict().items()}
    cert = certify(net, x, kinds=("local", "l2"))
    assert cert.local_bound == "none" and sorted(cert.columns) == ["margin", "pred"]
    with torch.no_grad():
        logits = net.double()(x.double())
    top2 = logits.topk(2, dim=1).values
    assert torch.equal(cert.columns["pred"], logits.argmax(1))
    torch.testing.assert_close(cert.columns["margin"], top2[:, 0] - top2[:, 1])
    net.float()
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_model_in_train_mode_is_certified_in_eval_mode_and_left_in_train_mode():
    class WithDropout(nn.Module):  # any module (an nn.Sequential of this shape is refused)
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.9), nn.Linear(8, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers(x)

    net = WithDropout().train()
    x = torch.rand(50, 3)
    first, second = certify(net, x), certify(net, x)
    assert net.training
    assert torch.equal(first.columns["margin"], second.columns["margin"])  # no dropout noise


def test_a_new_kind_of_model_is_certified_by_registering_its_bounds():
    class Linear(nn.Linear):
        pass

    @certify_model.register(Linear)
    def _(model, x, settings):  # exact for a linear classifier (L2)
        logits = model(x).detach()
        pred = logits.argmax(1)
        w = model.weight.detach()
        dist = (logits.gather(1, pred[:, None]) - logits) / (w[pred][:, None, :] - w).norm(dim=2)
        dist = dist.scatter(1, pred[:, None], float("inf"))
        return Certification({"pred": pred, "guarantee_l2": dist.min(1).values}, "exact")

    model = Linear(3, 4)
    cert = certify(model, torch.rand(8, 3))
    assert cert.local_bound == "exact" and cert.columns["guarantee_l2"].shape == (8,)
    assert certify(nn.Linear(3, 4), torch.rand(2, 3)).local_bound == "none"  # others unchanged

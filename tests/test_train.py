"""Training: determinism, divergence handling, a sensible error on the embedded data."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys

import pytest
import torch

import crosslip.training.single
from crosslip.data import load_dataset
from crosslip.models import SoftplusNet
from crosslip.models.checkpoints import load_model, save_model
from crosslip.training.adversarial import adversarial_batch
from crosslip.training.core import TrainConfig, lr_decay_updates
from crosslip.training.single import GradientDescent, train

from .helpers import toy_dataset


@pytest.fixture(scope="module")
def mnist5k():
    return load_dataset("mnist5k")


def test_short_training_reaches_sensible_error(mnist5k):
    ds = mnist5k
    for reg, lam in (("none", 0.0), ("cross_lipschitz", 1e-3)):
        cfg = TrainConfig(regularizer=reg, lam=lam, lr=0.2, epochs=3, hidden=256)
        res = train(cfg, ds)
        assert res.metrics["status"] == "ok"
        assert res.metrics["test_error"] < 0.15, res.metrics["test_error"]
        losses = [c["loss"] for c in res.metrics["curve"]]
        assert losses[-1] < losses[0]
        if reg == "cross_lipschitz":
            assert all(c["penalty"] > 0 for c in res.metrics["curve"])


def test_training_is_deterministic_for_a_seed(mnist5k):
    ds = mnist5k
    cfg = TrainConfig(regularizer="cross_lipschitz", lam=1e-3, epochs=1, hidden=32, seed=3)
    a = train(cfg, ds.head(512)).model
    b = train(cfg, ds.head(512)).model
    c = train(TrainConfig(**{**cfg.__dict__, "seed": 4}), ds.head(512)).model
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])
    assert not torch.equal(a.U, c.U)


def test_diverging_run_is_recorded(mnist5k):
    ds = mnist5k
    cfg = TrainConfig(regularizer="weight_decay", lam=1.0, lr=1e30, epochs=2, hidden=16)
    res = train(cfg, ds.head(256))
    assert res.metrics["status"] == "diverged"
    assert res.metrics["test_error"] is None


def test_bad_hyperparameters_are_rejected():
    with pytest.raises(ValueError, match="unknown regularizer 'l3'"):
        TrainConfig(regularizer="l3")
    with pytest.raises(ValueError, match="lambda = 0"):
        TrainConfig(regularizer="none", lam=0.1)


def test_model_file_round_trip(tmp_path):
    net = SoftplusNet(7, 3, hidden=5, alpha=10.0, bias=False)
    save_model(net, tmp_path / "m.pt", meta={"dataset": "x"})
    back = load_model(tmp_path / "m.pt")
    assert back.hyper == net.hyper
    for k, v in net.state_dict().items():
        assert torch.equal(v, back.state_dict()[k])
    assert sorted(os.listdir(tmp_path)) == ["m.pt"]  # no temporary file left


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > evil-was-here",))


def test_malicious_model_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "evil.pt", "wb") as fh:
        pickle.dump({"format": "crosslip.SoftplusNet/1", "x": _Evil()}, fh, protocol=2)
    with pytest.raises(ValueError, match="refused to load"):
        load_model(tmp_path / "evil.pt")
    assert not (tmp_path / "evil-was-here").exists()


def test_dropout_trains_with_dropped_units_and_predicts_deterministically():
    ds = load_dataset("mnist5k")
    cfg = TrainConfig(
        regularizer="dropout", keep_hidden=0.5, keep_input=0.9, lr=0.2, epochs=2, hidden=64
    )
    res = train(cfg, ds)
    assert res.metrics["status"] == "ok" and res.metrics["test_error"] < 0.2
    net = res.model
    assert net.hyper["keep_hidden"] == 0.5 and net.hyper["keep_input"] == 0.9
    x = torch.as_tensor(ds.x_test[:50])
    with torch.no_grad():
        assert torch.equal(net(x), net(x))  # eval mode: no dropout
        net.train()
        assert not torch.equal(net(x), net(x))  # training mode: units are dropped
    with pytest.raises(ValueError, match=r"keep probability in \(0, 1\]"):
        TrainConfig(regularizer="dropout", keep_hidden=0.0)
    with pytest.raises(ValueError, match="takes lambda = 0"):
        TrainConfig(regularizer="dropout", lam=0.5)
    with pytest.raises(ValueError, match="needs regularizer 'dropout'"):
        TrainConfig(regularizer="none", keep_input=0.9)


def test_dropout_keep_rates_of_hidden_units_and_inputs():
    """keep_hidden and keep_input are probabilities of keeping (the authors' meaning): the
    fraction of hidden units and inputs that survive a training forward pass matches them."""
    torch.manual_seed(0)
    d, h, n = 400, 500, 200
    net = SoftplusNet(d, 3, hidden=h, keep_hidden=0.3, keep_input=0.9).double().train()
    x = torch.rand(n, d, dtype=torch.float64) + 0.5  # no zero input
    kept_inputs = (net.input_dropout(x) != 0).double().mean().item()
    hidden = torch.rand(n, h, dtype=torch.float64) + 0.5
    kept_hidden = (net.dropout(hidden) != 0).double().mean().item()
    # 80,000 and 100,000 Bernoulli draws: standard errors about 0.001 and 0.0015
    assert abs(kept_inputs - 0.9) < 0.006 and abs(kept_hidden - 0.3) < 0.006
    # inverted dropout: survivors are scaled by 1/keep, so the mean is unchanged
    assert torch.allclose(net.dropout(hidden).mean(), hidden.mean(), rtol=0.02)
    _, z = net.logits_and_preactivation(x)  # the preactivation sees the dropped-out input
    assert not torch.allclose(z, net.preactivation(x))


def test_authors_initialisation_and_no_biases():
    torch.manual_seed(0)
    d, k, h = 784, 10, 1024
    net = SoftplusNet(d, k, hidden=h, init="authors")
    assert net.hidden_layer.bias is None and net.output_layer.bias is None
    assert abs(net.U.std().item() / (1 / (d * h)) ** 0.5 - 1) < 0.01
    assert abs(net.W.std().item() / (1 / (k * h)) ** 0.5 - 1) < 0.02
    with_bias = SoftplusNet(d, k, hidden=h, bias=True, init="authors")
    assert torch.all(with_bias.hidden_layer.bias == 0.1)
    default = SoftplusNet(d, k, hidden=h, init="pytorch")  # about 20x larger on MNIST
    assert default.U.std().item() / net.U.std().item() > 15


def test_learning_rate_decays_at_fractions_of_the_updates(monkeypatch):
    assert lr_decay_updates([0.72, 0.88], 1000) == {720, 880}
    ds = load_dataset("mnist5k")
    cfg = TrainConfig(
        lr=0.3, epochs=2, hidden=16, batch_size=1000, lr_decay=0.1, lr_decay_at=[0.5, 0.75]
    )
    seen = []
    real_step = GradientDescent.step

    def spy(self):
        seen.append(self.lr)
        return real_step(self)

    monkeypatch.setattr(GradientDescent, "step", spy)
    train(cfg, ds)
    # 4,000 points in batches of 1,000: 8 updates; decay after updates 4 and 6
    assert seen == pytest.approx([0.3] * 4 + [0.03] * 2 + [0.003] * 2)


class TorchSGD:
    """torch.optim.SGD behind GradientDescent's interface (the learning rate as ``lr``)."""

    def __init__(self, params, lr):
        self.opt = torch.optim.SGD(params, lr=lr)

    lr = property(
        lambda self: self.opt.param_groups[0]["lr"],
        lambda self, v: self.opt.param_groups[0].__setitem__("lr", v),
    )

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def step(self):
        self.opt.step()


@pytest.mark.parametrize(
    "changes",
    [
        {"regularizer": "cross_lipschitz", "lam": 1e-3, "lr_decay_at": [0.5, 0.75]},
        {"regularizer": "dropout", "keep_hidden": 0.5, "bias": True},
        {"arch": "resnet", "resnet_blocks": 1, "regularizer": "weight_decay", "lam": 1e-3},
    ],
    ids=["cl-decay", "dropout-bias", "resnet"],
)
def test_gradient_descent_equals_torch_sgd_bit_for_bit(mnist5k, monkeypatch, changes):
    """The whole training with GradientDescent gives exactly the model that torch.optim.SGD
    gives (every parameter, bit for bit), learning-rate decay included."""
    cfg = TrainConfig(epochs=2, hidden=16, batch_size=100, lr=0.2, seed=1, **changes)
    x, y = mnist5k.x_train[:400], mnist5k.y_train[:400]
    shape = (28, 28, 1)
    if cfg.arch == "resnet":
        x, shape = x.reshape(-1, 28, 28)[:, ::2, ::2].reshape(len(x), -1).copy(), (14, 14, 1)
    data = toy_dataset(x, y, 10, 50, shape)
    ours = train(cfg, data).model.state_dict()
    monkeypatch.setattr(crosslip.training.single, "GradientDescent", TorchSGD)
    theirs = train(cfg, data).model.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_gradient_descent_step_equals_torch_sgds_on_each_device(device):
    """One step on the same parameters and gradients, float32 and float64, a parameter
    without gradient left alone: bit for bit torch.optim.SGD's step (its CPU path is add_,
    its CUDA path _foreach_add_)."""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        shapes = [(7, 5), (5,), (3, 7), (4,)]
        init = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
        grads = [
            torch.randn(s, generator=g, dtype=dtype) * 10 ** (i - 2) for i, s in enumerate(shapes)
        ]
        runs = []
        for make in (GradientDescent, lambda ps, lr: torch.optim.SGD(ps, lr=lr)):
            params = [torch.nn.Parameter(t.clone().to(device)) for t in init]
            for p, gr in zip(params[:-1], grads, strict=False):  # the last one: no gradient
                p.grad = gr.to(device)
            make(params, 0.37).step()
            runs.append([p.detach().cpu() for p in params])
        ours, theirs = runs
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)
        assert torch.equal(ours[-1], init[-1]) and not torch.equal(ours[0], init[0])


def test_training_does_not_import_torch_dynamo():
    """Training stays clear of torch._dynamo (torch.optim imports it: about 1.1 s of every
    training job's start-up); checked in a fresh interpreter."""
    code = (
        "import sys, numpy as np\n"
        "from crosslip.data import Dataset\n"
        "from crosslip.training.single import TrainConfig, train\n"
        "x = np.random.default_rng(0).random((64, 4), dtype=np.float32)\n"
        "y = (x[:, 0] > 0.5).astype(np.int64)\n"
        "train(TrainConfig(epochs=1, hidden=4), Dataset('toy', x, y, x, y, (4,), 2))\n"
        "assert 'torch._dynamo' not in sys.modules, 'training imported torch._dynamo'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_augment_setting_trains_on_crops_and_tests_on_center_crops():
    ds = load_dataset("mnist5k")
    cfg = TrainConfig(setting="augment", lr=0.2, epochs=3, hidden=64)
    res = train(cfg, ds)
    assert res.model.hyper["in_dim"] == 24 * 24
    assert res.metrics["status"] == "ok" and res.metrics["test_error"] < 0.2
    for shape in ((784,), None):  # flat vectors, or no shape at all
        with pytest.raises(ValueError, match="image shape"):
            train(cfg, dataclasses.replace(ds, shape=shape))


def test_adversarial_batches_replace_the_stated_fraction_with_box_points():
    """The search attack (``adv_attack: search``) replaces the first half of the batch by
    samples that change the class; the one-step attack (the default) by points that moved
    inside the box; both leave the rest untouched and the model in train mode."""
    ds = load_dataset("mnist5k")
    torch.manual_seed(0)
    net = SoftplusNet(784, 10, hidden=32)
    xb = torch.as_tensor(ds.x_train[:64])
    cfg = TrainConfig(setting="adversarial", adv_norm="linf", adv_fraction=0.5)
    cfg_search = TrainConfig(**{**cfg.__dict__, "adv_attack": "search"})
    out = adversarial_batch(net, xb, cfg_search)
    assert out.shape == xb.shape and net.training
    assert torch.equal(out[32:], xb[32:])  # the second half is untouched
    changed = (out[:32] - xb[:32]).abs().amax(1) > 0
    assert changed.float().mean() > 0.9  # (almost) every attack succeeds on a random net
    assert out.min() >= 0 and out.max() <= 1
    with torch.no_grad():
        flipped = net(out[:32]).argmax(1) != net(xb[:32]).argmax(1)
    assert torch.equal(flipped, changed)  # every replaced point is adversarial
    fractions = torch.rand(32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = adversarial_batch(net, xb, cfg, fractions)
    assert out.shape == xb.shape and net.training and torch.equal(out[32:], xb[32:])
    moved = (out[:32] - xb[:32]).abs().amax(1)
    assert (moved > 0).all() and out.min() >= 0 and out.max() <= 1
    with pytest.raises(ValueError, match="needs its fractions"):
        adversarial_batch(net, xb, cfg)
    # the search's tolerance and steps are config keys: a finer search finds smaller samples
    coarse = adversarial_batch(
        net, xb, TrainConfig(**{**cfg_search.__dict__, "adv_search_steps": 1})
    )
    fine = adversarial_batch(
        net,
        xb,
        TrainConfig(**{**cfg_search.__dict__, "adv_search_rtol": 1e-4, "adv_search_steps": 30}),
    )
    size = {k: (v[:32] - xb[:32]).abs().amax(1) for k, v in (("coarse", coarse), ("fine", fine))}
    both = (size["coarse"] > 0) & (size["fine"] > 0)
    assert both.sum() > 20 and (size["fine"][both] <= size["coarse"][both] + 1e-12).all()
    assert (size["fine"][both] < size["coarse"][both]).float().mean() > 0.8
    assert size["fine"][both].sum() < 0.95 * size["coarse"][both].sum()
    for attack in ("one_step", "search"):
        cfg = TrainConfig(setting="adversarial", lr=0.2, epochs=1, hidden=32, adv_attack=attack)
        res = train(cfg, ds)
        assert res.metrics["status"] == "ok" and res.metrics["test_error"] < 0.35, attack

"""A grid trained as one batched model equals the same networks trained one by one.

In float64 on the CPU, every regularizer (none, weight decay, dropout, Cross-Lipschitz) in
every setting (plain, augment, adversarial with either attack), with different learning
rates and lambdas in one batch: parameters to 1e-10 after a few epochs, the same curves and
test errors. Dropout is compared under the same masks: the batched run records its masks
and the separate run of each dropout network replays them. A diverging grid point stops as
it would alone while the others go on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import crosslip.models.softplus_net as softplus_net
from crosslip.config.specs import spec_params
from crosslip.data import load_dataset
from crosslip.models import SoftplusNet, StackedSoftplusNet, class_gradients
from crosslip.training.core import TrainConfig
from crosslip.training.grid import DropoutMasks, GridStep, shared_settings, train_grid
from crosslip.training.single import train

from .device_checks import implicit_tensors_on_meta
from .helpers import UncheckedDataset, learnable_digits, random_net, random_points


@pytest.fixture(scope="module")
def digits32():
    """128 training and 64 test digits of mnist5k."""
    return load_dataset("mnist5k").head(128, 64)


@pytest.fixture(scope="module")
def digits(digits32):
    """The same digits in float64."""
    ds = digits32
    x_train, x_test = ds.x_train.astype(np.float64), ds.x_test.astype(np.float64)
    return UncheckedDataset(ds.name, x_train, ds.y_train, x_test, ds.y_test, ds.shape, 10)


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


#: The settings, adversarial training with each of its attacks (``train.adv_attack``).
SETTINGS = ["plain", "augment", "adversarial", "adversarial-search"]


def setting_fields(setting: str) -> dict[str, str]:
    """``setting`` (one of :data:`SETTINGS`) as TrainConfig fields."""
    name, _, attack = setting.partition("-")
    return {"setting": name, **({"adv_attack": attack} if attack else {})}


def grid(setting: str, **common) -> list[TrainConfig]:
    """Every regularizer, two learning rates, two lambdas: one batch of 9 networks."""
    common = {"epochs": 3, "hidden": 12, "batch_size": 32, "seed": 5, **setting_fields(setting)}
    common["crop"] = 20
    common.update(certified_radius=0.8, certified_warmup=0.5)
    return [
        TrainConfig(regularizer="cross_lipschitz", lam=1e-2, lr=0.5, **common),
        TrainConfig(regularizer="none", lr=0.2, **common),
        TrainConfig(regularizer="dropout", keep_hidden=0.5, keep_input=0.9, lr=0.2, **common),
        TrainConfig(regularizer="weight_decay", lam=1e-3, lr=0.2, **common),
        TrainConfig(regularizer="cross_lipschitz", lam=1e-3, lr=0.2, **common),
        TrainConfig(regularizer="none", lr=0.5, **common),
        TrainConfig(regularizer="dropout", keep_hidden=0.7, keep_input=0.9, lr=0.5, **common),
        TrainConfig(regularizer="certified_margin", lam=1.0, lr=0.2, **common),
        TrainConfig(regularizer="certified_margin", lam=0.5, lr=0.5, **common),
    ]


class Recorded(DropoutMasks):
    """The default masks, each draw kept (``latest``: the instance of the last run)."""

    latest: Recorded | None = None

    def __init__(self, specs, device):
        super().__init__(specs, device)
        self.draws: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
        Recorded.latest = self

    def scales(self, n, d, h, like):
        out = super().scales(n, d, h, like)
        self.draws.append(out)
        return out


class Replay(torch.nn.Module):
    """Dropout that multiplies by recorded scales, one per training-mode call."""

    def __init__(self, scales: list[torch.Tensor]):
        super().__init__()
        self.scales = iter(scales)

    def forward(self, x):
        return x * next(self.scales) if self.training else x


def train_alone(cfg, data, monkeypatch, recorded: Recorded | None):
    """``crosslip.training.single.train`` of one network; a dropout network replays the masks that
    the batched run drew for it."""
    if cfg.regularizer == "dropout":
        g = next(i for i, s in enumerate(recorded.specs) if s is cfg)
        replays = [
            Replay([draw[0][g] for draw in recorded.draws]),  # input (made first)
            Replay([draw[1][g] for draw in recorded.draws]),  # hidden
        ]
        monkeypatch.setattr(softplus_net, "_dropout", lambda keep: replays.pop(0))
    try:
        return train(cfg, data)
    finally:
        monkeypatch.undo()


def assert_same_training(batched, alone):
    pairs = zip(batched.model.state_dict().items(), alone.model.state_dict().values(), strict=True)
    for (name, a), b in pairs:
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
    mb, ma = batched.metrics, alone.metrics
    for key in ("status", "epochs_completed", "test_error", "train_error", "n_train", "config"):
        assert mb[key] == ma[key], key
    for cb, ca in zip(mb["curve"], ma["curve"], strict=True):
        assert cb["epoch"] == ca["epoch"] and cb["train_error"] == ca["train_error"]
        assert cb["loss"] == pytest.approx(ca["loss"], rel=1e-10)
        assert cb["penalty"] == pytest.approx(ca["penalty"], rel=1e-10, abs=1e-300)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_batched_grid_equals_separate_trainings(setting, digits, float64, monkeypatch):
    cfgs = grid(setting)
    batched = train_grid(cfgs, digits, masks=Recorded)
    recorded = Recorded.latest
    assert len(batched) == len(cfgs) and len(recorded.draws) == 3 * 4  # epochs x batches
    for cfg, result in zip(cfgs, batched, strict=True):
        assert result.metrics["grid_networks"] == len(cfgs)
        assert result.metrics["config"]["regularizer"] == cfg.regularizer
        assert_same_training(result, train_alone(cfg, digits, monkeypatch, recorded))
    # the networks did learn, and differently
    assert all(r.metrics["curve"][-1]["loss"] < r.metrics["curve"][0]["loss"] for r in batched)
    assert not torch.equal(batched[1].model.U, batched[5].model.U)  # lr 0.2 and 0.5


@pytest.mark.parametrize("setting", SETTINGS)
def test_training_creates_every_tensor_on_the_device_it_means(setting, digits32):
    """With PyTorch's default device set to ``meta`` (tests/device_checks.py), a tensor
    created without a device
    lands there and fails as soon as it meets the data (as a CPU tensor would among CUDA
    tensors): both trainings run through and give what they give without the check."""
    common = {"epochs": 1, "hidden": 8, "batch_size": 32, "crop": 20, **setting_fields(setting)}
    cfgs = [
        TrainConfig(regularizer="cross_lipschitz", lam=1e-3, **common),
        TrainConfig(regularizer="weight_decay", lam=1e-3, **common),
        TrainConfig(regularizer="dropout", keep_hidden=0.5, keep_input=0.9, **common),
    ]
    data = digits32.head(64)

    def both():
        alone = [train(c, data).model for c in cfgs]
        return alone + [r.model for r in train_grid(cfgs, data)]

    plain = both()
    with implicit_tensors_on_meta():
        checked = both()
    for a, b in zip(plain, checked, strict=True):
        assert a.U.device.type == "cpu" and torch.equal(a.U, b.U)


def test_a_diverging_grid_point_stops_alone(digits, float64, monkeypatch):
    common = {"epochs": 3, "hidden": 12, "batch_size": 32, "seed": 1}
    cfgs = [
        TrainConfig(regularizer="weight_decay", lam=1.0, lr=1e30, **common),
        TrainConfig(regularizer="cross_lipschitz", lam=1e-3, lr=0.2, **common),
    ]
    batched = train_grid(cfgs, digits)
    assert batched[0].metrics["status"] == "diverged" and batched[0].metrics["test_error"] is None
    assert batched[1].metrics["status"] == "ok" and batched[1].metrics["epochs_completed"] == 3
    for cfg, result in zip(cfgs, batched, strict=True):
        assert_same_training(result, train_alone(cfg, digits, monkeypatch, None))


def test_dropout_masks_differ_between_grid_points_and_not_between_batches(digits32):
    """Each dropout network draws its masks from a generator of its own: different networks
    get different masks, and one network gets the same masks in any batch (its weights do
    not depend on the networks trained beside it)."""
    common = {"epochs": 1, "hidden": 12, "batch_size": 32, "seed": 2}
    a, b, plain, cl = (
        TrainConfig(regularizer="dropout", keep_hidden=0.5, keep_input=0.9, lr=0.2, **common),
        TrainConfig(regularizer="dropout", keep_hidden=0.5, keep_input=0.9, lr=0.5, **common),
        TrainConfig(regularizer="none", lr=0.2, **common),
        TrainConfig(regularizer="cross_lipschitz", lam=1e-3, lr=0.2, **common),
    )

    def masks_of(cfgs, cfg):
        results = train_grid(cfgs, digits32, masks=Recorded)
        rec = Recorded.latest
        g = next(i for i, s in enumerate(rec.specs) if s is cfg)
        draws = [(i[g].clone(), h[g].clone()) for i, h in rec.draws]
        return results[cfgs.index(cfg)], draws, rec

    first, a_masks, rec = masks_of([a, b, plain], a)
    again, a_again, _ = masks_of([cl, a], a)
    for (i1, h1), (i2, h2) in zip(a_masks, a_again, strict=True):
        assert torch.equal(i1, i2) and torch.equal(h1, h2)
    torch.testing.assert_close(first.model.U, again.model.U, rtol=1e-5, atol=1e-6)
    ga, gb, gp = (next(i for i, s in enumerate(rec.specs) if s is c) for c in (a, b, plain))
    for inputs, hidden in rec.draws:
        assert not torch.equal(hidden[ga], hidden[gb]) and not torch.equal(inputs[ga], inputs[gb])
        assert torch.equal(hidden[gp], torch.ones_like(hidden[gp]))  # no dropout
        assert torch.equal(inputs[gp], torch.ones_like(inputs[gp]))
        dropped = hidden[[ga, gb]]
        assert 0.35 < (dropped > 0).float().mean().item() < 0.65
        assert set(dropped.unique().tolist()) == {0.0, 2.0}  # mask / keep
    second = train_grid([a, b, plain], digits32)  # deterministic
    assert torch.equal(second[0].model.U, first.model.U)


def test_on_epoch_sees_every_epoch_in_the_callers_order_and_changes_nothing(digits, float64):
    """The callback gets each epoch's networks in the order of ``cfgs`` (the stack orders
    them by regularizer), the last ones equal to the results, and the training is the same
    as without it."""
    cfgs = grid("plain")
    seen: list[tuple[int, list[SoftplusNet]]] = []
    with_callback = train_grid(cfgs, digits, on_epoch=lambda e, nets: seen.append((e, nets)))
    without = train_grid(cfgs, digits)
    assert [e for e, _ in seen] == [1, 2, 3]
    for _, nets in seen:
        assert len(nets) == len(cfgs) and all(not net.training for net in nets)
        assert [net.hyper["keep_hidden"] for net in nets] == [c.keep_hidden for c in cfgs]
    for net, a, b in zip(seen[-1][1], with_callback, without, strict=True):
        assert torch.equal(net.U, a.model.U) and torch.equal(net.W, a.model.W)
        assert torch.equal(a.model.U, b.model.U) and torch.equal(a.model.W, b.model.W)


def test_only_networks_that_share_their_settings_train_together():
    a = TrainConfig(regularizer="none", epochs=2, hidden=8)
    b = TrainConfig(**{**a.__dict__, "regularizer": "cross_lipschitz", "lam": 0.1, "lr": 0.5})
    assert shared_settings([a, b]) == shared_settings([a])
    assert "lr" not in shared_settings([a]) and shared_settings([a])["epochs"] == 2
    for field, value in [("epochs", 3), ("seed", 1), ("hidden", 9), ("setting", "augment")]:
        b = TrainConfig(
            **{**a.__dict__, "regularizer": "cross_lipschitz", "lam": 0.1, field: value}
        )
        with pytest.raises(ValueError, match=f"differs from network 0 in {field}"):
            shared_settings([a, b])
    with pytest.raises(ValueError, match="not resnet"):
        shared_settings([TrainConfig(arch="resnet")])


def test_a_stack_computes_each_of_its_networks():
    nets = [random_net(7, 4, 5, seed, bias=True) for seed in range(3)]
    stack = StackedSoftplusNet(nets)
    x = random_points(6, 7, 0)
    logits = stack(x)
    assert logits.shape == (3, 6, 4)
    for g, net in enumerate(nets):
        torch.testing.assert_close(logits[g], net(x), rtol=1e-13, atol=1e-15)
        rng = torch.get_rng_state()
        back = stack.network(g)
        # a copy draws nothing (on CUDA its draws once hit a generator a failed capture had
        # left marked as capturing)
        assert torch.equal(torch.get_rng_state(), rng)
        assert isinstance(back, SoftplusNet) and back.hyper == net.hyper
        assert back.U.dtype == stack.U.dtype and back.U.device == stack.U.device
        for a, b in zip(back.state_dict().values(), net.state_dict().values(), strict=True):
            assert torch.equal(a, b)
    # every row by its own network, rows of the networks interleaved and uneven
    group = torch.tensor([2, 0, 2, 2, 1, 0])
    rows = stack.grouped_logits(x, group)
    grads = stack.grouped_class_gradients(x, group)
    for i, g in enumerate(group.tolist()):
        torch.testing.assert_close(rows[i], nets[g](x[i : i + 1])[0], rtol=1e-14, atol=1e-15)
        torch.testing.assert_close(grads[i], class_gradients(nets[g], x[i : i + 1])[0])
    with pytest.raises(ValueError, match="differs from network 0 in hidden"):
        StackedSoftplusNet([random_net(7, 4, 5, 0), random_net(7, 4, 6, 0)])


def test_the_step_reads_nothing_back_from_the_device():
    """A step must be replayable as a recorded graph: no value goes to the host (no
    ``item``, ``tolist``, ``bool`` of a tensor, no data-dependent shape)."""
    nets = [random_net(7, 4, 5, seed) for seed in range(3)]
    cfgs = [
        TrainConfig(regularizer="cross_lipschitz", lam=0.1, hidden=5),
        TrainConfig(regularizer="weight_decay", lam=0.1, hidden=5),
        TrainConfig(regularizer="none", hidden=5),
    ]
    step = GridStep(StackedSoftplusNet(nets), cfgs)
    x, y = random_points(8, 7, 1), torch.arange(8) % 4
    from .sync_checks import no_host_reads

    with no_host_reads():
        step(x, y)
    assert step.updates.tolist() == [1, 1, 1] and step.alive.all()
    # with the one-step attack's samples made inside the step (adversarial training)
    before = step.stack.U.detach().clone()
    step = GridStep(step.stack, cfgs, adv_norm=float("inf"))
    fractions = torch.rand(4, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    samples = step.one_step_inputs(x, fractions)
    assert samples.shape == (3, 8, 7) and not torch.equal(samples[:, :4], x[:4].expand(3, 4, 7))
    with no_host_reads():
        step(x, y, fractions=fractions)
    assert step.updates.tolist() == [1, 1, 1] and not torch.equal(step.stack.U, before)


@pytest.mark.parametrize("adv_norm", [None, 1.0, 2.0, float("inf")])
def test_the_step_copies_nothing_from_the_host(adv_norm):
    """A recorded step must not copy from the host either (a capture refuses a copy from
    pageable memory; a value copied would be frozen): on the ``meta`` device, after the
    warm-up that recording runs first (a cache may fill then), no operator of the step, the
    one-step samples and dropout's scales included, is given a CPU tensor."""
    from .sync_checks import no_host_reads, no_host_tensors

    nets = [random_net(7, 4, 5, seed) for seed in range(4)]
    cfgs = [
        TrainConfig(regularizer="none", hidden=5),
        TrainConfig(regularizer="dropout", keep_hidden=0.5, keep_input=0.9, hidden=5),
        TrainConfig(regularizer="weight_decay", lam=0.1, hidden=5),
        TrainConfig(regularizer="cross_lipschitz", lam=0.1, hidden=5),
    ]
    meta = torch.device("meta")
    step = GridStep(StackedSoftplusNet(nets).to(meta), cfgs, adv_norm=adv_norm)
    x, y = random_points(8, 7, 1).to(meta), (torch.arange(8) % 4).to(meta)
    scales = (torch.ones(4, 8, 7, device=meta), torch.ones(4, 8, 5, device=meta))
    fractions = torch.rand(3, dtype=x.dtype, device=meta) if adv_norm else None
    step(x, y, *scales, fractions)  # the warm-up
    with no_host_tensors(), no_host_reads():
        step(x, y, *scales, fractions)
    assert step.updates.device == meta and step.updates.shape == (4,)


def test_no_host_tensors_fails_a_copy_from_the_host_inside_the_step():
    """The check above fails on the mistakes it is there for."""
    from .sync_checks import HostReadError, no_host_tensors

    meta = torch.device("meta")
    x = torch.ones(3, 4, device=meta)
    for mistake in (
        lambda: x * torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device),  # values from host
        lambda: x[[0, 2]],  # a Python list as an index
        lambda: x + torch.zeros(4),  # a tensor made on the host
    ):
        with pytest.raises(HostReadError, match="CPU tensor"), no_host_tensors():
            mistake()
    with no_host_tensors():
        (x * 2.0 + torch.ones(4, device=meta)).sum()  # Python numbers are no copy


def test_a_recording_that_fails_leaves_the_state_as_it_was(monkeypatch, caplog):
    """Recording runs the step twice before the capture; if a run fails (say, out of
    memory), the weights and the bookkeeping are restored and training goes on op by op.
    (The CUDA calls are stood in for here; tests below record on a GPU.)"""
    import contextlib

    import crosslip.training.grid as grid

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    fake = {
        "device": lambda d: contextlib.nullcontext(),
        "current_stream": lambda d=None: Stream(),
        "Stream": Stream,
        "stream": lambda s: contextlib.nullcontext(),
        "set_stream": lambda s: None,
    }
    for name, value in fake.items():
        monkeypatch.setattr(grid.torch.cuda, name, value)
    nets = [random_net(7, 4, 5, seed) for seed in range(2)]
    cfgs = [
        TrainConfig(regularizer="none", hidden=5),
        TrainConfig(regularizer="cross_lipschitz", lam=0.1, hidden=5),
    ]
    step = GridStep(StackedSoftplusNet(nets), cfgs)
    x, y = random_points(8, 7, 1), torch.arange(8) % 4
    before = [t.detach().clone() for t in step.state()]
    runs = []
    real = GridStep.__call__

    def fails_second_time(self, *args):
        runs.append(1)
        if len(runs) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (stood in)")
        real(self, *args)

    monkeypatch.setattr(GridStep, "__call__", fails_second_time)
    with caplog.at_level("WARNING", logger="crosslip.training.grid"):
        assert grid.record_step(step, x, y, None, None) is None
    assert len(runs) == 2
    for t, b in zip(step.state(), before, strict=True):
        assert torch.equal(t, b)
    assert "could not be recorded as a CUDA graph (CUDA out of memory (stood in))" in caplog.text


# ---------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("setting", ["plain", "adversarial"])
def test_a_batched_grid_on_cuda_reaches_the_test_errors_of_separate_trainings(setting):
    """After a short training on real digits the batched networks' test errors are those of
    the networks trained one by one, within 0.5% (other kernels, other summation order)."""
    ds = load_dataset("mnist5k")
    common = {"epochs": 3, "hidden": 256, "seed": 0, "setting": setting}
    cfgs = [
        TrainConfig(regularizer="none", lr=0.2, **common),
        TrainConfig(regularizer="weight_decay", lam=1e-4, lr=0.2, **common),
        TrainConfig(regularizer="cross_lipschitz", lam=1e-3, lr=0.2, **common),
        TrainConfig(regularizer="cross_lipschitz", lam=1e-2, lr=0.5, **common),
    ]
    batched = train_grid(cfgs, ds, device="cuda")
    for cfg, result in zip(cfgs, batched, strict=True):
        alone = train(cfg, ds, device="cuda")
        assert result.metrics["status"] == alone.metrics["status"] == "ok"
        assert result.metrics["cuda_graph"] is True
        assert abs(result.metrics["test_error"] - alone.metrics["test_error"]) <= 0.005


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("setting", ["plain", "adversarial"])
def test_the_recorded_cuda_step_trains_as_the_step_run_op_by_op(setting):
    """The recorded step (in the adversarial setting with the one-step samples made inside
    it) trains as the same step run op by op."""
    ds = load_dataset("mnist5k")
    common = {"epochs": 2, "hidden": 64, "seed": 0, "setting": setting}
    cfgs = [
        TrainConfig(regularizer="dropout", keep_hidden=0.5, keep_input=0.9, lr=0.2, **common),
        TrainConfig(regularizer="cross_lipschitz", lam=1e-3, lr=0.2, **common),
    ]
    data = ds.head(1000)
    graphed = train_grid(cfgs, data, device="cuda", cuda_graph=True)
    direct = train_grid(cfgs, data, device="cuda", cuda_graph=False)
    for a, b in zip(graphed, direct, strict=True):
        assert a.metrics["cuda_graph"] and not b.metrics["cuda_graph"]
        torch.testing.assert_close(a.model.U, b.model.U, rtol=1e-5, atol=1e-6)
        assert a.metrics["curve"][-1]["loss"] == pytest.approx(b.metrics["curve"][-1]["loss"])


@pytest.mark.cuda
@needs_cuda
def test_a_capture_that_fails_falls_back_to_the_step_run_op_by_op(monkeypatch):
    """A step that cannot be captured (here: it reads a value while capturing) trains op
    by op from where it was, on the current stream as before, as the same training without
    a graph does."""
    real = GridStep.__call__

    def reads_while_capturing(self, *args):
        if torch.cuda.is_current_stream_capturing():
            self.alive.sum().item()
        real(self, *args)

    ds = load_dataset("mnist5k")
    common = {"epochs": 2, "hidden": 64, "seed": 0}
    cfgs = [
        TrainConfig(regularizer="none", lr=0.2, **common),
        TrainConfig(regularizer="cross_lipschitz", lam=1e-3, lr=0.2, **common),
    ]
    data = ds.head(1000)
    direct = train_grid(cfgs, data, device="cuda", cuda_graph=False)
    monkeypatch.setattr(GridStep, "__call__", reads_while_capturing)
    stream = torch.cuda.current_stream()
    fallback = train_grid(cfgs, data, device="cuda", cuda_graph=True)
    assert torch.cuda.current_stream() == stream
    torch.cuda.empty_cache()  # the allocator is not stuck in a capture
    torch.rand(3, device="cuda")  # nor the device's generator (it raised here once)
    again = train_grid(cfgs[1:], data, device="cuda", cuda_graph=False)
    torch.testing.assert_close(again[0].model.U, direct[1].model.U, rtol=1e-6, atol=1e-7)
    for a, b in zip(fallback, direct, strict=True):
        assert not a.metrics["cuda_graph"] and a.metrics["status"] == "ok"
        torch.testing.assert_close(a.model.U, b.model.U, rtol=1e-6, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_the_step_records_on_the_device_of_its_tensors_not_the_current_one():
    """On ``cuda:1`` (the current device being ``cuda:0``) the recorded step trains as the
    step run op by op."""
    ds = load_dataset("mnist5k")
    common = {"epochs": 2, "hidden": 64, "seed": 0}
    cfgs = [TrainConfig(regularizer="cross_lipschitz", lam=1e-3, lr=0.2, **common)]
    data = ds.head(1000)
    graphed = train_grid(cfgs, data, device="cuda:1", cuda_graph=True)
    direct = train_grid(cfgs, data, device="cuda:1", cuda_graph=False)
    assert graphed[0].metrics["cuda_graph"]
    torch.testing.assert_close(graphed[0].model.U, direct[0].model.U, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("enabled", [False, True])
def test_the_tf32_setting_holds_while_a_network_trains_and_is_restored_after(
    enabled, digits, float64, monkeypatch
):
    """``train.tf32`` sets TF32 for CUDA's float32 products and convolutions during the
    training (batched or alone), whatever was set before, and puts the settings back; on
    the CPU the weights do not depend on it."""
    import crosslip.training.core as core
    import crosslip.training.grid as grid

    seen = []
    real_grid, real_alone = grid.grid_errors, core.error_rate

    def flags():
        return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def grid_errors(*args):
        seen.append(flags())
        return real_grid(*args)

    def error_rate(*args):
        seen.append(flags())
        return real_alone(*args)

    monkeypatch.setattr(grid, "grid_errors", grid_errors)
    monkeypatch.setattr(core, "error_rate", error_rate)
    before = flags()
    cfg = TrainConfig(epochs=1, hidden=8, tf32=enabled)
    batched = train_grid([cfg], digits)
    alone = train(cfg, digits)
    assert seen[0] == (enabled, enabled) == seen[1] and flags() == before
    other = train_grid([TrainConfig(epochs=1, hidden=8, tf32=not enabled)], digits)
    torch.testing.assert_close(other[0].model.U, batched[0].model.U, rtol=0, atol=0)
    assert batched[0].metrics["config"]["tf32"] is enabled and alone.metrics["status"] == "ok"


def test_a_grid_job_trains_batched_on_cuda_and_one_by_one_on_the_cpu(tmp_path, monkeypatch):
    """crosslip.stages.training.train_grid_stage: on the CPU by default one network after
    another with the single-model trainer (the batched model is slower there: bench_grid),
    each exactly as a job of its own trains it; ``batched=True`` gives the batched model,
    the same networks to float32 rounding; on CUDA batched by default."""
    from crosslip.models.checkpoints import load_model
    from crosslip.stages import training as stage

    data = learnable_digits(tmp_path / "data.npz", n_train=96, n_test=32)
    common = {"epochs": 2, "hidden": 12, "batch_size": 32, "seed": 3}
    specs = {
        "none": TrainConfig(regularizer="none", lr=0.2, **common),
        "cl": TrainConfig(regularizer="cross_lipschitz", lr=0.1, lam=1e-3, **common),
    }

    def outputs(way):
        return {
            m: (tmp_path / way / m / "model.pt", tmp_path / way / m / "metrics.json") for m in specs
        }

    def weights(path):
        return torch.cat([p.detach().flatten() for p in load_model(path).parameters()])

    batched_calls = []
    real_train_grid = stage.train_grid
    monkeypatch.setattr(
        stage, "train_grid", lambda *a, **k: batched_calls.append(1) or real_train_grid(*a, **k)
    )
    default = stage.train_grid_stage(data, specs, outputs("default"), "cpu")
    assert batched_calls == []  # one by one on the CPU
    for m, met in default.items():
        assert met["grid_batched"] is False and met["grid_networks"] == 1
        assert met["grid_models"] == list(specs)
        alone = stage.train_stage(data, spec_params(specs[m]), m, *outputs("alone")[m], "cpu")
        assert alone["test_error"] == met["test_error"]
        assert torch.equal(weights(outputs("alone")[m][0]), weights(outputs("default")[m][0]))
    batched = stage.train_grid_stage(data, specs, outputs("batched"), "cpu", batched=True)
    assert batched_calls == [1]
    for m, met in batched.items():
        assert met["grid_batched"] is True and met["grid_networks"] == 2
        torch.testing.assert_close(
            weights(outputs("batched")[m][0]),
            weights(outputs("default")[m][0]),
            rtol=1e-4,
            atol=1e-5,
        )
    assert stage.batched_on(torch.device("cuda")) and not stage.batched_on(torch.device("cpu"))

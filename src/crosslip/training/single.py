"""Training of the one-hidden-layer network with SGD (Section 5).

Objective (Eq. eq:L-Alg): mean cross-entropy + lambda * regularizer, where the regularizer is
``none``, ``cross_lipschitz`` (exact closed form, Section 3.2) or ``weight_decay``
(half the squared norm of the weights, as the authors' ``tf.nn.l2_loss``); ``dropout``
(Section 5) keeps each hidden unit with probability ``keep_hidden`` and each input
coordinate with ``keep_input`` during training (the paper's "dropout probabilities" are the
authors' keep probabilities; inverted dropout: nothing changes at test time, so the certified
and attacked function is the plain network). SGD with mini-batches (64 in the paper); the
learning rate is multiplied by ``lr_decay`` after each fraction ``lr_decay_at`` of all updates
(the authors' schedule: x0.1 at 72% and x0.01 at 88%). Deterministic for a fixed seed on one
machine.

In production this trainer runs the ResNets and, with ``train.batch_grid: false``, every
network one job each; with ``batch_grid`` on (the default), the one-hidden-layer networks of
a grid job train one after another here on the CPU and together on CUDA in
:mod:`crosslip.training.grid` (:func:`crosslip.stages.training.batched_on`), which is tested
against this trainer: each grid point comes out as :func:`train` trains it alone
(tests/test_train_grid.py, float64).
What both do alike (seeds, data and crops, schedule, curves, metrics) is
:mod:`crosslip.training.core`; the adversarial samples are :mod:`crosslip.training.adversarial`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import torch
from torch.nn import functional as F

from ..data.augment import augment
from ..data.dataset import Dataset
from ..device import in_tf32
from ..errors import ConfigError
from ..models import SoftplusNet
from ..models.resnet import ResNet
from ..progress import Progress
from . import core
from .adversarial import adversarial_batch, adversarial_fractions
from .certified_margin import CertifiedMargin, warmup_updates
from .core import TrainConfig, TrainResult
from .regularizers import cross_lipschitz_autograd, cross_lipschitz_softplus, weight_decay


class GradientDescent:
    """Plain mini-batch SGD, ``theta <- theta - lr * grad`` (Section 5; no momentum, no weight
    decay in the optimizer: the paper's and the authors' optimizer), with a learning rate
    that the schedule changes (``lr``).

    The same update as ``torch.optim.SGD(params, lr)``, bit for bit: ``p + (-lr) * g`` per
    element, as ``add_(g, alpha=-lr)`` (SGD's path on the CPU) and ``_foreach_add_`` (its
    path on CUDA) compute it; tests/test_train.py compares whole trainings. It is not
    ``torch.optim.SGD`` because constructing any ``torch.optim`` optimizer imports
    ``torch._dynamo`` (PyTorch 2.x), which costs every training job about 1.1 s of start-up
    on a 2-core CPU, more than a small job's training."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float):
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        with_grad = [p for p in self.params if p.grad is not None]
        if with_grad:
            torch._foreach_add_(with_grad, [p.grad for p in with_grad], alpha=-self.lr)


def objective_terms(
    net: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: TrainConfig,
    certified: CertifiedMargin | None = None,
    updates: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy on the batch ``(x, y)`` and the penalty (without lambda) of the
    chosen regularizer: Cross-Lipschitz in closed form for the one-hidden-layer net (sharing
    the forward pass's preactivation), by double backpropagation (exact) for any other
    architecture; the certified margin (one-hidden-layer nets only) from its state
    ``certified`` at the radius of ``updates`` updates done."""
    if cfg.regularizer == "certified_margin":
        if certified is None or not isinstance(net, SoftplusNet):
            raise ValueError("the certified margin trains one-hidden-layer nets with its state")
        logits, z = net.logits_and_preactivation(x)
        done = torch.tensor(updates, device=x.device)
        pen = certified.penalty(z, logits, y, net.U, net.W, done)
        return F.cross_entropy(logits, y), pen
    if cfg.regularizer == "cross_lipschitz" and isinstance(net, SoftplusNet):
        logits, z = net.logits_and_preactivation(x)
        return F.cross_entropy(logits, y), cross_lipschitz_softplus(net, x, preactivation=z)
    ce = F.cross_entropy(net(x), y)
    if cfg.regularizer == "cross_lipschitz":
        return ce, cross_lipschitz_autograd(net, x)
    if cfg.regularizer == "weight_decay":
        return ce, weight_decay(net)
    return ce, x.new_zeros(())


def _network(
    cfg: TrainConfig, shape: tuple[int, ...] | None, in_dim: int, num_classes: int
) -> torch.nn.Module:
    """The network of ``cfg``: a ResNet for images of ``shape``, else a :class:`SoftplusNet`."""
    if cfg.arch == "resnet":
        drop_hidden = 1.0 - cfg.keep_hidden
        return ResNet(
            shape, num_classes, cfg.resnet_blocks, cfg.resnet_width, cfg.alpha, drop_hidden
        )
    return SoftplusNet(
        in_dim,
        num_classes,
        cfg.hidden,
        cfg.alpha,
        cfg.bias,
        keep_hidden=cfg.keep_hidden,
        keep_input=cfg.keep_input,
        init=cfg.init,
    )


@in_tf32(lambda cfg, *args, **kwargs: cfg.tf32)
def train(cfg: TrainConfig, data: Dataset, device: torch.device | str = "cpu") -> TrainResult:
    """Train a :class:`SoftplusNet` (``cfg.arch`` ``resnet``: a :class:`ResNet`) on ``data``;
    returns it (on CPU) with metrics.

    Read from ``data``: the training points ``x_train`` (n, d) and labels ``y_train`` (n,),
    the test points ``x_test`` (n_test, d) and labels ``y_test`` (n_test,), the number of
    classes ``num_classes`` and the image shape ``shape``, which the augment setting and the
    ResNet need as (h, w, c) and the other trainings do not read (flat (d,) will do).

    Settings (Section 5): ``plain``; ``augment``: every batch is augmented
    (:func:`crosslip.data.augment.augment`, images of ``data.shape`` cropped to ``cfg.crop``;
    the test error is on center crops, the model takes crops); ``adversarial``: the first
    ``adv_fraction`` of every batch is replaced by box-constrained samples of the current
    model in the ``adv_norm``, with their true labels: ``adv_attack`` ``one_step`` (the
    authors' code, :mod:`crosslip.attacks.one_step`: one step towards the runner-up class
    for a random fraction of the gap, the fractions of each epoch drawn by
    :func:`adversarial_fractions`) or ``search`` (:func:`crosslip.attacks.upper_bound`, the
    paper's evaluation procedure with ``adv_search_rtol`` and ``adv_search_steps``; a point
    whose attack fails stays as it is).

    ``metrics`` holds ``status`` (``ok`` or ``diverged``: a non-finite loss stops training),
    ``test_error``, ``train_error``, the per-epoch ``curve`` (mean loss, penalty, train
    error), ``seconds`` and ``device``. Progress goes to the ``"crosslip"`` logger
    (:mod:`crosslip.progress`): a line per epoch with its curve point, learning rate and
    seconds. ``cfg.tf32``: on CUDA, float32 products and convolutions may use TF32
    (:func:`crosslip.device.tf32`; off: IEEE float32).
    """
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    gens = core.generators(cfg.seed)
    td = core.setup_data(cfg, data, device)
    with torch.device("cpu"):  # initialised on the CPU (its RNG), then moved: any device
        net = _network(cfg, td.model_shape, td.in_dim, data.num_classes)
    net = net.to(device)
    opt = GradientDescent(net.parameters(), lr=cfg.lr)
    curve: list[dict[str, float]] = []
    status = "ok"
    t0 = time.perf_counter()
    n, batches = td.n, td.batches
    schedule = core.Schedule([cfg], cfg.epochs * batches)
    certified = None
    if cfg.regularizer == "certified_margin":
        if not isinstance(net, SoftplusNet):
            raise ConfigError("the certified_margin regularizer trains the mlp architecture")
        warm = warmup_updates(cfg.certified_warmup, cfg.epochs * batches)
        certified = CertifiedMargin(
            net.U, net.W, net.alpha, cfg.certified_radius, warm, gens.certified
        )
    updates = 0
    progress = Progress(
        "train", cfg.epochs, "epochs", every=1 / max(cfg.epochs, 1), fractional=True
    )
    for epoch in range(cfg.epochs):
        t_epoch = time.perf_counter()
        net.train()
        perm = torch.randperm(n, generator=gens.batches, device="cpu").to(device)
        fractions = adversarial_fractions(cfg, batches, gens.adversarial)
        if fractions is not None:  # one copy per epoch
            fractions = fractions.to(device, td.x.dtype)
        tot_loss = tot_pen = 0.0
        for b, i in enumerate(range(0, n, cfg.batch_size)):
            idx = perm[i : i + cfg.batch_size]
            xb, yb = td.x[idx], td.y[idx]
            if td.augmenting:
                xb = augment(xb, data.shape, gens.augment, size=cfg.crop, colour=data.shape[2] == 3)
            elif cfg.setting == "adversarial":
                xb = adversarial_batch(net, xb, cfg, None if fractions is None else fractions[b])
            ce, pen = objective_terms(net, xb, yb, cfg, certified, updates)
            loss = ce + cfg.lam * pen
            if not math.isfinite(loss.item()):
                status = "diverged"
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            updates += 1
            if schedule.after_update(updates):
                opt.lr = schedule.lrs[0]
            tot_loss += loss.item() * len(idx)
            tot_pen += pen.item() * len(idx)
            progress.advance_bar(1 / batches)
        if status != "ok":
            core.log_diverged(epoch + 1, updates + 1)
            break
        train_error = core.error_rate(net, td.x_eval, td.y)
        seconds = time.perf_counter() - t_epoch
        core.record_epoch(curve, progress, (tot_loss, tot_pen), n, train_error, opt.lr, seconds)
    progress.close()
    seconds = time.perf_counter() - t0
    net = net.cpu().eval()
    metrics = core.metrics(cfg, net, status, curve, td, data.y_test, seconds, device)
    return TrainResult(net, metrics)

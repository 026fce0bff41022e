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
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from ..attacks import one_step, upper_bound
from ..config.specs import NetTrainSpec
from ..data.augment import augment, center_crop
from ..device import in_tf32
from ..errors import ConfigError
from ..families import NET_REGULARIZERS
from ..models import SoftplusNet
from ..models.resnet import ResNet
from ..norms import norm_p
from ..progress import Progress
from .regularizers import cross_lipschitz_autograd, cross_lipschitz_softplus, weight_decay

LOG = logging.getLogger(__name__)
REGULARIZERS = NET_REGULARIZERS
#: Section 5's three settings: plain, data augmentation, adversarial training.
SETTINGS = ("plain", "augment", "adversarial")

#: Hyperparameters of one training job: the workflow's typed spec, defaults from the schema.
TrainConfig = NetTrainSpec


@dataclass
class TrainResult:
    model: SoftplusNet
    metrics: dict[str, Any]


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
    net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy on the batch ``(x, y)`` and the penalty (without lambda) of the
    chosen regularizer: Cross-Lipschitz in closed form for the one-hidden-layer net (sharing
    the forward pass's preactivation), by double backpropagation (exact) for any other
    architecture."""
    if cfg.regularizer == "cross_lipschitz" and isinstance(net, SoftplusNet):
        logits, z = net.logits_and_preactivation(x)
        return F.cross_entropy(logits, y), cross_lipschitz_softplus(net, x, preactivation=z)
    ce = F.cross_entropy(net(x), y)
    if cfg.regularizer == "cross_lipschitz":
        return ce, cross_lipschitz_autograd(net, x)
    if cfg.regularizer == "weight_decay":
        return ce, weight_decay(net)
    return ce, x.new_zeros(())


def adversarial_rows(cfg: TrainConfig, n: int) -> int:
    """How many points of a batch of ``n`` adversarial training replaces:
    ``ceil(adv_fraction n)``."""
    return math.ceil(cfg.adv_fraction * n)


def makes_one_step_samples(cfg: TrainConfig) -> bool:
    """Whether the network trains adversarially with ``adv_attack`` ``one_step``."""
    return cfg.setting == "adversarial" and cfg.adv_attack == "one_step"


def adversarial_fractions(
    cfg: TrainConfig, batches: int, generator: torch.Generator
) -> torch.Tensor | None:
    """The one-step attack's fractions ``r`` of one epoch (:mod:`crosslip.attacks.one_step`),
    (batches, ceil(adv_fraction batch_size)), float64 on the CPU, uniform in [0, 1) from
    ``generator`` (the training seed's, shared by every network of that seed, like the batch
    order); row ``b`` serves batch ``b`` (a shorter last batch uses its first entries).
    None unless :func:`makes_one_step_samples`."""
    if not makes_one_step_samples(cfg):
        return None
    m = adversarial_rows(cfg, cfg.batch_size)
    return torch.rand(batches, m, generator=generator, dtype=torch.float64, device="cpu")


def adversarial_generator(seed: int) -> torch.Generator:
    """The generator of :func:`adversarial_fractions` for a training seed (``seed + 2``; the
    batch order draws from ``seed``, the augmentations from ``seed + 1``)."""
    return torch.Generator(device="cpu").manual_seed(seed + 2)


def adversarial_batch(
    net: torch.nn.Module,
    xb: torch.Tensor,
    cfg: TrainConfig,
    fractions: torch.Tensor | None = None,
) -> torch.Tensor:
    """``xb`` (n, d) with its first ``adv_fraction`` replaced by adversarial samples of
    ``net`` in ``adv_norm`` (see :func:`train`), made in eval mode (no dropout); the model is
    left in train mode. ``adv_attack`` ``one_step`` takes the fractions ``r`` (at least m,
    on ``xb``'s device) of :func:`adversarial_fractions`."""
    m = adversarial_rows(cfg, len(xb))
    if m == 0:
        return xb
    p = norm_p(cfg.adv_norm)
    net.eval()
    if cfg.adv_attack == "one_step":
        if fractions is None:
            raise ValueError("the one-step attack needs its fractions (adversarial_fractions)")
        first = one_step(net, xb[:m], fractions[:m], p)
        net.train()
        return torch.cat([first, xb[m:]])
    ub = upper_bound(net, xb[:m], p=p, rtol=1e-2, max_steps=10, dtype=xb.dtype, progress=False)
    net.train()
    adv = (xb[:m] + ub.delta.to(xb.device, xb.dtype)).clamp(0, 1)
    return torch.cat([torch.where(ub.success.to(xb.device)[:, None], adv, xb[:m]), xb[m:]])


def lr_decay_updates(fractions: list[float], total: int) -> set[int]:
    """The update counts after which the learning rate decays: ``round(f * total)`` for each
    fraction ``f`` of all ``total`` SGD updates (the authors' piecewise-constant schedule)."""
    return {round(f * total) for f in fractions}


@torch.no_grad()
def error_rate(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 4096
) -> float:
    """Fraction of misclassified points."""
    model.eval()
    wrong = 0
    for i in range(0, len(x), batch):
        wrong += int((model(x[i : i + batch]).argmax(1) != y[i : i + batch]).sum())
    return wrong / max(len(x), 1)


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
def train(
    cfg: TrainConfig,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
    device: torch.device | str = "cpu",
    shape: tuple[int, ...] | None = None,
) -> TrainResult:
    """Train a :class:`SoftplusNet`; returns it (on CPU) with metrics.

    Settings (Section 5): ``plain``; ``augment``: every batch is augmented
    (:func:`crosslip.data.augment.augment`, images of ``shape`` cropped to ``cfg.crop``; the test
    error is on center crops, the model takes crops); ``adversarial``: the first
    ``adv_fraction`` of every batch is replaced by box-constrained samples of the current
    model in the ``adv_norm``, with their true labels: ``adv_attack`` ``one_step`` (the
    authors' code, :mod:`crosslip.attacks.one_step`: one step towards the runner-up class
    for a random fraction of the gap, the fractions of each epoch drawn by
    :func:`adversarial_fractions`) or ``search`` (:func:`crosslip.attacks.upper_bound`, the
    paper's evaluation procedure with rtol 1e-2 and 10 bisection steps; a point whose attack
    fails stays as it is).

    ``metrics`` holds ``status`` (``ok`` or ``diverged``: a non-finite loss stops training),
    ``test_error``, ``train_error``, the per-epoch ``curve`` (mean loss, penalty, train
    error), ``seconds`` and ``device``. Progress goes to the ``"crosslip"`` logger
    (:mod:`crosslip.progress`): a line per epoch with its curve point, learning rate and
    seconds. ``cfg.tf32``: on CUDA, float32 products and convolutions may use TF32
    (:func:`crosslip.device.tf32`; off: IEEE float32).
    """
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    aug_gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)
    adv_gen = adversarial_generator(cfg.seed)
    augmenting = cfg.setting == "augment"
    if (augmenting or cfg.arch == "resnet") and (shape is None or len(shape) != 3):
        raise ConfigError("the augment setting and the resnet need the image shape (h, w, c)")
    model_shape = shape
    if augmenting and cfg.crop > min(shape[:2]):
        raise ConfigError(
            f"train.crop = {cfg.crop} is larger than the images ({shape[0]} x {shape[1]}); "
            f"set train.crop to at most {min(shape[:2])}"
        )
    if augmenting:
        model_shape = (cfg.crop, cfg.crop, shape[2])
        x_test = center_crop(torch.from_numpy(np.asarray(x_test)), shape, cfg.crop).numpy()
    in_dim = x_train.shape[1] if not augmenting else int(np.prod(model_shape))
    with torch.device("cpu"):  # initialised on the CPU (its RNG), then moved: any device
        net = _network(cfg, model_shape, in_dim, num_classes)
    net = net.to(device)
    xtr = torch.as_tensor(x_train, device=device)
    ytr = torch.as_tensor(y_train, device=device)
    xtr_eval = center_crop(xtr, shape, cfg.crop) if augmenting else xtr  # for train_error
    opt = GradientDescent(net.parameters(), lr=cfg.lr)
    curve: list[dict[str, float]] = []
    status = "ok"
    t0 = time.perf_counter()
    n = len(xtr)
    decay_after = lr_decay_updates(cfg.lr_decay_at, cfg.epochs * math.ceil(n / cfg.batch_size))
    updates = 0
    batches = math.ceil(n / cfg.batch_size)
    progress = Progress(
        "train", cfg.epochs, "epochs", every=1 / max(cfg.epochs, 1), fractional=True
    )
    for epoch in range(cfg.epochs):
        t_epoch = time.perf_counter()
        net.train()
        perm = torch.randperm(n, generator=gen, device="cpu").to(device)
        fractions = adversarial_fractions(cfg, batches, adv_gen)
        if fractions is not None:  # one copy per epoch
            fractions = fractions.to(device, xtr.dtype)
        tot_loss = tot_pen = 0.0
        for b, i in enumerate(range(0, n, cfg.batch_size)):
            idx = perm[i : i + cfg.batch_size]
            xb, yb = xtr[idx], ytr[idx]
            if augmenting:
                xb = augment(xb, shape, aug_gen, size=cfg.crop, colour=shape[2] == 3)
            elif cfg.setting == "adversarial":
                xb = adversarial_batch(net, xb, cfg, None if fractions is None else fractions[b])
            ce, pen = objective_terms(net, xb, yb, cfg)
            loss = ce + cfg.lam * pen
            if not math.isfinite(loss.item()):
                status = "diverged"
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            updates += 1
            if updates in decay_after:
                opt.lr *= cfg.lr_decay
            tot_loss += loss.item() * len(idx)
            tot_pen += pen.item() * len(idx)
            progress.advance_bar(1 / batches)
        if status != "ok":
            LOG.info(
                "train: non-finite loss in epoch %d (update %d): stopped, status diverged",
                epoch + 1,
                updates + 1,
            )
            break
        curve.append(
            {
                "epoch": epoch + 1,
                "loss": tot_loss / n,
                "penalty": tot_pen / n,
                "train_error": error_rate(net, xtr_eval, ytr),
            }
        )
        progress.update(
            1,
            loss=curve[-1]["loss"],
            penalty=curve[-1]["penalty"],
            train_error=curve[-1]["train_error"],
            lr=opt.lr,
            epoch_seconds=time.perf_counter() - t_epoch,
        )
    progress.close()
    seconds = time.perf_counter() - t0
    net = net.cpu().eval()
    xte, yte = torch.from_numpy(np.asarray(x_test)), torch.from_numpy(np.asarray(y_test))
    metrics: dict[str, Any] = {
        "status": status,
        "epochs_completed": len(curve),
        "test_error": error_rate(net, xte, yte) if status == "ok" else None,
        "train_error": curve[-1]["train_error"] if curve else None,
        "curve": curve,
        "seconds": seconds,
        "device": str(device),
        "n_train": int(n),
        "n_test": len(x_test),
        "config": asdict(cfg),
    }
    return TrainResult(net, metrics)

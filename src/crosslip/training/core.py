"""What every network training of Section 5 does the same way, written once: the single
trainer (:mod:`.single`) and the grid trainer (:mod:`.grid`) both use it.

* the seeds: the global RNG (the initialisation) and the generators of the batch order, the
  augmentations and the one-step attack's fractions (:func:`generators`);
* the data on the device, with the crops of the augment setting (:func:`setup_data`);
* the learning-rate schedule of G networks (:class:`Schedule`);
* an epoch's curve point and its progress line, the line of a diverged network, and the
  metrics of a finished one (:func:`record_epoch`, :func:`log_diverged`, :func:`metrics`),
  returned with the model as a :class:`TrainResult`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..config.specs import NetTrainSpec
from ..data.augment import center_crop
from ..data.dataset import Dataset
from ..errors import ConfigError
from ..progress import Progress
from .adversarial import adversarial_generator

LOG = logging.getLogger(__name__)

#: Hyperparameters of one training job: the workflow's typed spec, defaults from the schema.
TrainConfig = NetTrainSpec


@dataclass
class TrainResult:
    """A trained model (on the CPU, in eval mode) and its metrics (:func:`metrics`)."""

    model: torch.nn.Module
    metrics: dict[str, Any]


@dataclass
class Generators:
    """The CPU generators of a training seed: the batch order (``seed``), the augmentations
    (``seed + 1``), the one-step attack's fractions (``seed + 2``) and the certified margin's
    curvature vectors (``seed + 3``)."""

    batches: torch.Generator
    augment: torch.Generator
    adversarial: torch.Generator
    certified: torch.Generator


def generators(seed: int) -> Generators:
    """The generators of the training seed ``seed``; the global RNG (the initialisation) is
    seeded by the caller with ``torch.manual_seed(seed)``."""
    return Generators(
        torch.Generator(device="cpu").manual_seed(seed),
        torch.Generator(device="cpu").manual_seed(seed + 1),
        adversarial_generator(seed),
        torch.Generator(device="cpu").manual_seed(seed + 3),
    )


@dataclass
class TrainData:
    """The training data on the device and what the setting makes of it.

    ``x`` (n, d) and ``y`` (n,) on the device; ``x_eval``: ``x`` as the train error sees it
    (center crops in the augment setting); ``x_test`` (n_test, d'), host array, cropped
    likewise; ``model_shape``: the image shape the model takes (the crop's in the augment
    setting); ``in_dim``: its input dimension d'; ``batches``: batches per epoch."""

    x: torch.Tensor
    y: torch.Tensor
    x_eval: torch.Tensor
    x_test: np.ndarray
    model_shape: tuple[int, ...] | None
    in_dim: int
    augmenting: bool
    batches: int

    @property
    def n(self) -> int:
        return len(self.x)


def setup_data(cfg: TrainConfig, data: Dataset, device: torch.device) -> TrainData:
    """The data of a training of ``cfg`` on ``device``: the training points of ``data``
    (``x_train`` (n, d), ``y_train`` (n,)) and its test points ``x_test``, images of its
    ``shape`` (h, w, c). Raises :class:`ConfigError` where the augment setting or the ResNet
    lacks the image shape (``shape`` flat or None), or the crop ``cfg.crop`` is larger than
    the images."""
    x_train, y_train, x_test, shape = data.x_train, data.y_train, data.x_test, data.shape
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
    x = torch.as_tensor(x_train, device=device)
    y = torch.as_tensor(y_train, device=device)
    x_eval = center_crop(x, shape, cfg.crop) if augmenting else x
    batches = math.ceil(len(x) / cfg.batch_size)
    return TrainData(x, y, x_eval, x_test, model_shape, in_dim, augmenting, batches)


def lr_decay_updates(fractions: list[float], total: int) -> set[int]:
    """The update counts after which the learning rate decays: ``round(f * total)`` for each
    fraction ``f`` of all ``total`` SGD updates (the authors' piecewise-constant schedule)."""
    return {round(f * total) for f in fractions}


class Schedule:
    """The learning rates of G networks (``cfgs``) over ``total`` updates: each is multiplied
    by its ``lr_decay`` after each fraction ``lr_decay_at`` of the updates."""

    def __init__(self, cfgs: list[TrainConfig], total: int) -> None:
        self.cfgs = cfgs
        self.lrs = [c.lr for c in cfgs]
        self.decay_after = [lr_decay_updates(c.lr_decay_at, total) for c in cfgs]

    def after_update(self, updates: int) -> bool:
        """Decay the rates due after ``updates`` updates; whether any changed."""
        decays = [g for g, due in enumerate(self.decay_after) if updates in due]
        for g in decays:
            self.lrs[g] *= self.cfgs[g].lr_decay
        return bool(decays)


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


def record_epoch(
    curve: list[dict[str, float]],
    progress: Progress,
    sums: tuple[float, float],
    n: int,
    train_error: float,
    lr: float,
    seconds: float,
) -> None:
    """Append the epoch's point to ``curve``: the mean loss and penalty (``sums``: their
    sums over the epoch's points, ``n`` of them) and the train error; report it on
    ``progress`` with the learning rate and the epoch's ``seconds``."""
    curve.append(
        {
            "epoch": len(curve) + 1,
            "loss": sums[0] / n,
            "penalty": sums[1] / n,
            "train_error": train_error,
        }
    )
    progress.update(
        1,
        loss=curve[-1]["loss"],
        penalty=curve[-1]["penalty"],
        train_error=curve[-1]["train_error"],
        lr=lr,
        epoch_seconds=seconds,
    )


def log_diverged(epoch: int, update: int, **extra: Any) -> None:
    """The line of a network whose loss was not finite in ``epoch`` (1-based) at ``update``
    (1-based): its training stopped there."""
    LOG.info(
        "train: non-finite loss in epoch %d (update %d): stopped, status diverged",
        epoch,
        update,
        **extra,
    )


def metrics(
    cfg: TrainConfig,
    net: torch.nn.Module,
    status: str,
    curve: list[dict[str, float]],
    data: TrainData,
    y_test: np.ndarray,
    seconds: float,
    device: torch.device,
) -> dict[str, Any]:
    """The metrics of a finished training of ``net`` (on the CPU): ``status`` (``ok`` or
    ``diverged``), ``epochs_completed``, ``test_error`` (None if diverged), ``train_error``
    (the last epoch's), the ``curve``, ``seconds``, ``device``, ``n_train``, ``n_test`` and
    the spec as ``config``."""
    xte, yte = torch.from_numpy(np.asarray(data.x_test)), torch.from_numpy(np.asarray(y_test))
    return {
        "status": status,
        "epochs_completed": len(curve),
        "test_error": error_rate(net, xte, yte) if status == "ok" else None,
        "train_error": curve[-1]["train_error"] if curve else None,
        "curve": curve,
        "seconds": seconds,
        "device": str(device),
        "n_train": int(data.n),
        "n_test": len(data.x_test),
        "config": asdict(cfg),
    }

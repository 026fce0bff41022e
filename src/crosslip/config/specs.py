"""Typed training specs (one per training job) and the model ids that name them."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError
from ..families import ARCHS, KERNEL_REGULARIZERS, NET_REGULARIZERS
from ..norms import NORMS
from .schema import default_field

#: Section 5's settings of the networks, initialisations, norms and attacks of adversarial
#: training (``train.adv_attack``: crosslip.training.adversarial).
SETTINGS = ("plain", "augment", "adversarial")
INITS = ("authors", "pytorch")
ADV_NORM_NAMES = tuple(NORMS)
ADV_ATTACKS = ("one_step", "search")


@dataclass
class NetTrainSpec:
    """Hyperparameters of one network training job (SGD, Section 5). Defaults: the schema's.

    ``lam`` weighs the penalty of ``weight_decay``, ``cross_lipschitz`` and
    ``certified_margin`` and is 0 for ``none`` and ``dropout``; ``certified_margin``
    networks train for the L2 radius ``certified_radius``, reached after the fraction
    ``certified_warmup`` of the updates (:mod:`crosslip.training.certified_margin`);
    dropout networks keep each hidden unit with probability ``keep_hidden`` and each input
    coordinate with ``keep_input`` in training (1 = no dropout; other regularizers keep
    everything). The learning rate is multiplied by ``lr_decay``
    after each fraction ``lr_decay_at`` of all updates. ``tf32``: on CUDA, float32 products
    and convolutions of the training may use TF32 (:func:`crosslip.device.tf32`).
    """

    regularizer: str = "none"
    lam: float = 0.0
    lr: float = 0.2
    keep_hidden: float = 1.0
    keep_input: float = 1.0
    epochs: int = default_field("train.epochs")
    batch_size: int = default_field("train.batch_size")
    seed: int = 0
    hidden: int = default_field("model.hidden")
    alpha: float = default_field("model.alpha")
    bias: bool = default_field("model.bias")
    init: str = default_field("model.init")
    lr_decay: float = default_field("train.lr_decay")
    lr_decay_at: list[float] = default_field("train.lr_decay_at")
    arch: str = default_field("model.arch")
    resnet_blocks: int = default_field("model.resnet_blocks")
    resnet_width: int = default_field("model.resnet_width")
    setting: str = "plain"
    crop: int = default_field("train.crop")
    adv_norm: str = default_field("train.adv_norm")
    adv_fraction: float = default_field("train.adv_fraction")
    adv_attack: str = default_field("train.adv_attack")
    adv_search_rtol: float = default_field("train.adv_search_rtol")
    adv_search_steps: int = default_field("train.adv_search_steps")
    certified_radius: float = default_field("train.certified_radius")
    certified_warmup: float = default_field("train.certified_warmup")
    tf32: bool = default_field("train.tf32")

    def __post_init__(self) -> None:
        _one_of("regularizer", self.regularizer, NET_REGULARIZERS)
        _one_of("arch", self.arch, ARCHS)
        _one_of("setting", self.setting, SETTINGS)
        _one_of("adv_norm", self.adv_norm, ADV_NORM_NAMES)
        _one_of("adv_attack", self.adv_attack, ADV_ATTACKS)
        _one_of("init", self.init, INITS)
        if self.regularizer == "certified_margin" and self.arch != "mlp":
            raise ConfigError(
                f"regularizer 'certified_margin' trains the one-hidden-layer network (model.arch "
                f"mlp), not {self.arch}: its bound is the curvature certificate of that network"
            )
        if self.regularizer in ("none", "dropout") and self.lam != 0:
            raise ConfigError(f"regularizer {self.regularizer!r} takes lambda = 0 (got {self.lam})")
        for name in ("keep_hidden", "keep_input"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"{name} is a keep probability in (0, 1]; got {value}")
            if self.regularizer != "dropout" and value != 1:
                raise ConfigError(f"{name} = {value} needs regularizer 'dropout'")
        if any(not 0 < f < 1 for f in self.lr_decay_at):
            raise ConfigError(f"lr_decay_at takes fractions in (0, 1); got {self.lr_decay_at}")

    @property
    def hyperparameter(self) -> float:
        """The grid's value of the regularizer: ``keep_hidden`` for dropout, else ``lam``."""
        return self.keep_hidden if self.regularizer == "dropout" else self.lam


@dataclass
class KernelTrainSpec:
    """Hyperparameters of one Gaussian-kernel training job (L-BFGS, Sections 3.1 and 5)."""

    regularizer: str = "kernel_cl"
    lam: float = 1e-2
    a: float = 1.0
    n_centers: int = default_field("kernel.n_centers")
    neighbours: int = default_field("kernel.neighbours")
    max_iter: int = default_field("kernel.max_iter")
    tol: float = 1e-7
    seed: int = 0

    def __post_init__(self) -> None:
        _one_of("kernel regularizer", self.regularizer, KERNEL_REGULARIZERS)


def _one_of(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {what} {value!r}; allowed: {', '.join(choices)}")


def fmt_num(x: float) -> str:
    """A number as it appears in a model id (``1e-05``, ``0.2``)."""
    return f"{x:g}"


def net_model_id(regularizer: str, lr: float, value: float, seed: int, setting: str) -> str:
    """The id of a network: ``<regularizer>-lr<lr>-lam<lambda>-seed<seed>`` (``keep<p>``
    instead of ``lam`` for dropout), ``-augment`` / ``-adversarial`` appended outside the
    plain setting; the numbers as :func:`fmt_num` writes them."""
    tag = "keep" if regularizer == "dropout" else "lam"
    model_id = f"{regularizer}-lr{fmt_num(lr)}-{tag}{fmt_num(value)}-seed{seed}"
    return model_id if setting == "plain" else f"{model_id}-{setting}"


def kernel_model_id(regularizer: str, a: float, lam: float, seed: int) -> str:
    """The id of a Gaussian-kernel model: ``<regularizer>-a<a>-lam<lambda>-seed<seed>``."""
    return f"{regularizer}-a{fmt_num(a)}-lam{fmt_num(lam)}-seed{seed}"


_NET_ID = re.compile(
    r"^(?P<reg>[a-z_]+)-lr(?P<lr>.+?)-(?P<tag>lam|keep)(?P<value>.+?)-seed(?P<seed>\d+)"
    r"(?:-(?P<setting>augment|adversarial))?$"
)
_KERNEL_ID = re.compile(r"^(?P<reg>kernel_[a-z]+)-a(?P<a>.+?)-lam(?P<lam>.+?)-seed(?P<seed>\d+)$")
#: The fields of a training spec that the model id states (with ``keep_input``, which
#: follows from the regularizer and ``train.keep_input``).
NET_ID_FIELDS = ("regularizer", "lam", "lr", "keep_hidden", "keep_input", "seed", "setting")
KERNEL_ID_FIELDS = ("regularizer", "a", "lam", "seed")


def spec_from_tracked(model_id: str, tracked: dict[str, Any]) -> NetTrainSpec | KernelTrainSpec:
    """The training spec of ``model_id`` from its id and :func:`tracked_params`."""
    if m := _KERNEL_ID.match(model_id):
        return KernelTrainSpec(
            regularizer=m["reg"],
            a=float(m["a"]),
            lam=float(m["lam"]),
            seed=int(m["seed"]),
            **tracked,
        )
    m = _NET_ID.match(model_id)
    if m is None:
        raise ValueError(f"{model_id!r} is not the id of a network or kernel model of a grid")
    rest = dict(tracked)
    keep_input = rest.pop("dropout_keep_input")
    dropout, value = m["reg"] == "dropout", float(m["value"])
    return NetTrainSpec(
        regularizer=m["reg"],
        lr=float(m["lr"]),
        lam=0.0 if dropout else value,
        keep_hidden=value if dropout else 1.0,
        keep_input=keep_input if dropout else 1.0,
        seed=int(m["seed"]),
        setting=m["setting"] or "plain",
        **rest,
    )


def spec_params(spec: NetTrainSpec | KernelTrainSpec) -> dict[str, Any]:
    """A spec as the plain dict a training job receives (``params.hyper``)."""
    return asdict(spec)


def spec_from_params(params: dict[str, Any]) -> NetTrainSpec | KernelTrainSpec:
    """The spec back from :func:`spec_params`."""
    cls = KernelTrainSpec if params["regularizer"] in KERNEL_REGULARIZERS else NetTrainSpec
    return cls(**params)

"""The networks of a preset that the benchmarks time."""

from __future__ import annotations

from pathlib import Path

import yaml

from crosslip.config.grid import training_grid
from crosslip.config.specs import NetTrainSpec
from crosslip.config.validate import validate


def preset_networks(
    preset: Path | str, setting: str, hidden: int, epochs: int
) -> list[NetTrainSpec]:
    """The networks that the config file ``preset`` trains in ``setting``, with
    ``model.hidden`` and ``train.epochs`` replaced: Cross-Lipschitz first, then by learning
    rate and lambda (the grids the benchmarks time)."""
    config = yaml.safe_load(Path(preset).read_text())
    config["train"]["settings"] = [setting]
    config.setdefault("model", {})["hidden"] = hidden
    config["train"]["epochs"] = epochs
    nets = [s for s in training_grid(validate(config)).values() if isinstance(s, NetTrainSpec)]
    return sorted(nets, key=lambda s: (s.regularizer != "cross_lipschitz", s.lr, s.lam))

"""How upper bounds are computed: the config's ``attack`` settings as frozen objects.

Their defaults are the schema's (``crosslip/config/schema.yaml``), read once here; the
workflow's attack rule passes its params (:func:`crosslip.jobs.batches.evaluation_params`)
as :meth:`AttackSettings.from_params`, and the object goes whole through the stage
(:mod:`crosslip.stages.attack`) into the attacks; the minimal-norm attack
(:func:`.min_norm.min_norm_attack`) takes its part, :class:`MinNormSettings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config.schema import default

#: The prefix of the minimal-norm attack's keys among the attack's (``min_norm_steps``).
MIN_NORM = "min_norm_"


@dataclasses.dataclass(frozen=True)
class MinNormSettings:
    """The minimal-norm L2 attack's ``attack.min_norm_*`` keys: iterations per walk
    (``steps``; 0 turns the attack off in the stage), targeted walks (``targets``) and
    random restarts (``restarts``) per point, early stopping (``tol``, ``patience``) and the
    pruning of far targets (``prune``)."""

    steps: int = default("attack.min_norm_steps")
    targets: int = default("attack.min_norm_targets")
    restarts: int = default("attack.min_norm_restarts")
    tol: float = default("attack.min_norm_tol")
    patience: int = default("attack.min_norm_patience")
    prune: float = default("attack.min_norm_prune")

    def but(self, **changes: Any) -> MinNormSettings:
        """A copy with ``changes`` (field names; a :class:`TypeError` names an unknown one)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class AttackSettings:
    """The ``attack`` keys of the configuration (docs/configuration.md) and the device.

    ``n_points``: the eval points; ``rtol`` and ``max_steps``: the search for the decision
    boundary (Section 4); ``norms``: the norms attacked; ``refine_steps``: the
    re-linearizations of the refinement; ``min_norm``: the minimal-norm L2 attack;
    ``n_examples``: the eval points whose L2 samples are kept for the illustration
    (``attack.example_candidates``); ``device``: ``auto``, ``cpu``, ``cuda[:N]``."""

    n_points: int = default("attack.n_points")
    rtol: float = default("attack.rtol")
    max_steps: int = default("attack.max_steps")
    norms: tuple[str, ...] = tuple(default("attack.norms"))
    refine_steps: int = default("attack.refine_steps")
    min_norm: MinNormSettings = MinNormSettings()
    n_examples: int = default("attack.example_candidates")
    device: str = default("device")

    def __post_init__(self) -> None:
        object.__setattr__(self, "norms", tuple(self.norms))

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AttackSettings:
        """The settings from an attack job's ``params``, whose keys are the fields, with the
        minimal-norm attack's as ``min_norm_<field>`` (other entries, such as the code
        digest, are ignored)."""
        return DEFAULT_SETTINGS.but(**{k: v for k, v in params.items() if k in FLAT_NAMES})

    def but(self, **changes: Any) -> AttackSettings:
        """A copy with ``changes``: field names, or ``min_norm_<field>`` for a field of the
        minimal-norm attack (a :class:`TypeError` names an unknown one)."""
        inner = {k[len(MIN_NORM) :]: v for k, v in changes.items() if k.startswith(MIN_NORM)}
        outer = {k: v for k, v in changes.items() if not k.startswith(MIN_NORM)}
        if inner:
            outer["min_norm"] = outer.get("min_norm", self.min_norm).but(**inner)
        return dataclasses.replace(self, **outer)


#: The schema's settings.
DEFAULT_SETTINGS = AttackSettings()
#: The settings' keys as the attack rule's params name them.
FLAT_NAMES = tuple(
    [f.name for f in dataclasses.fields(AttackSettings) if f.name != "min_norm"]
    + [MIN_NORM + f.name for f in dataclasses.fields(MinNormSettings)]
)


def attack_settings_with(
    settings: AttackSettings | None, changes: Mapping[str, Any]
) -> AttackSettings:
    """``settings`` (default: :data:`DEFAULT_SETTINGS`) with the keyword ``changes`` a
    caller passed beside it (:meth:`AttackSettings.but`)."""
    base = settings or DEFAULT_SETTINGS
    return base.but(**changes) if changes else base

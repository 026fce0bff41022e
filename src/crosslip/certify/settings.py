"""How certificates are computed: the config's ``certify`` settings as one frozen object.

Its defaults are the schema's (``crosslip/config/schema.yaml``), read once here; the
workflow's certify rule passes its params (:func:`crosslip.jobs.batches.evaluation_params`)
as :meth:`CertifySettings.from_params`, and the object goes whole through the stage
(:mod:`crosslip.stages.certification`) into the algorithms (:func:`.engine.certify_softplus`,
:func:`.dispatch.certify`), which read the fields they need.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config.schema import default


@dataclasses.dataclass(frozen=True)
class CertifySettings:
    """The ``certify`` keys of the configuration (docs/configuration.md), and the device and
    the kernel memory budget that a certification uses.

    ``n_points``: the eval points; ``rtol``: relative precision of the searches over R;
    ``kinds``: the guarantee families; ``tangent_steps``: steps on the linear relaxation's
    tangent points; ``trust_region_steps``: Lanczos steps of the L2 and L-inf curvature
    certificates minimised over the ball (0: their curvature forms only); ``expansion_steps``: its
    bounds again about moved expansion points; ``expansion_ascent_steps``: then (L2, L1)
    about points found by gradient ascent; ``integration_nodes``:
    nodes of Theorem 2.1 integrated; ``device``: ``auto``, ``cpu``, ``cuda[:N]``;
    ``memory_gb``: the Gaussian-kernel bound's budget."""

    n_points: int = default("certify.n_points")
    rtol: float = default("certify.rtol")
    kinds: tuple[str, ...] = tuple(default("certify.kinds"))
    tangent_steps: int = default("certify.tangent_steps")
    trust_region_steps: int = default("certify.trust_region_steps")
    expansion_steps: int = default("certify.expansion_steps")
    expansion_ascent_steps: int = default("certify.expansion_ascent_steps")
    integration_nodes: int = default("certify.integration_nodes")
    device: str = default("device")
    memory_gb: float = default("kernel.memory_gb")

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(self.kinds))

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CertifySettings:
        """The settings from a certify job's ``params`` (extra entries, such as the code
        digest, are ignored)."""
        return cls(**{f.name: params[f.name] for f in dataclasses.fields(cls) if f.name in params})

    def but(self, **changes: Any) -> CertifySettings:
        """A copy with ``changes`` (field names; a :class:`TypeError` names an unknown one)."""
        return dataclasses.replace(self, **changes)


#: The schema's settings.
DEFAULT_SETTINGS = CertifySettings()


def settings_with(settings: CertifySettings | None, changes: Mapping[str, Any]) -> CertifySettings:
    """``settings`` (default: :data:`DEFAULT_SETTINGS`) with the keyword ``changes`` a
    caller passed beside it."""
    return (
        (settings or DEFAULT_SETTINGS).but(**changes) if changes else (settings or DEFAULT_SETTINGS)
    )

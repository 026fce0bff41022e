"""The workflow's stages, gathered in one namespace for the library user and the tests.

Each stage lives in its own module of :mod:`crosslip.stages` (the workflow's scripts import
those, so that a job depends only on the code it runs); this module re-exports them.
"""

from __future__ import annotations

from .stages.attack import attack_stage
from .stages.certification import certify_stage
from .stages.common import eval_indices, eval_points
from .stages.data import prepare_data
from .stages.external import import_model_stage
from .stages.instances import instances_stage
from .stages.parquet import empty_frame, write_parquet
from .stages.training import train_stage

__all__ = [
    "attack_stage",
    "certify_stage",
    "empty_frame",
    "eval_indices",
    "eval_points",
    "import_model_stage",
    "instances_stage",
    "prepare_data",
    "train_stage",
    "write_parquet",
]

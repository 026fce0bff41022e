"""The training projection's line (``projected`` of ``benchmarks/projection.py``)."""

import math

import pytest

from .helpers import benchmark_module

projected = benchmark_module("projection.py")["projected"]


def test_two_trainings_give_the_cost_of_an_epoch_and_the_fixed_part():
    p = projected(5.0, 9.0, 1, 3, 200, scale=10.0)
    assert p["seconds_per_epoch"] == 20.0 and p["fixed_seconds"] == 3.0
    assert p["projected_seconds"] == 3.0 + 200 * 20.0 and not p["through_origin"]
    origin = projected(0.0, 6.0, 0, 3, 10)
    assert origin["seconds_per_epoch"] == 2.0 and origin["fixed_seconds"] == 0.0


@pytest.mark.parametrize("t1", [1.98, 5.8])
def test_a_longer_training_that_was_not_slower_never_projects_free_epochs(t1):
    """On an H200 the first training of a process (1 epoch, 5.8 s: the context, cuBLAS and
    kernel loads) took longer than the next (3 epochs, 1.98 s): the line through the two
    projected 200 epochs to 6 s. The line through the origin and the longer run does not."""
    p = projected(t1, 1.98, 1, 3, 200, scale=10.0)
    assert p["through_origin"] and p["fixed_seconds"] == 0.0
    assert math.isclose(p["seconds_per_epoch"], 1.98 / 3 * 10)
    assert p["projected_seconds"] > 200 * 1.98 / 3

"""The operation counter (benchmarks.op_count) and the check built on the same rule
(tests/sync_checks.py): each way of reading a value back to the host is caught, and code
with fixed shapes that reads nothing passes."""

from __future__ import annotations

import pytest
import torch

from benchmarks.op_count import OpCount

from .sync_checks import HostReadError, no_host_reads

X = torch.arange(6.0)
MASK = X > 2

#: Code that reads a value back to the host, one way each.
READS = {
    "item": lambda: X.sum().item(),
    "bool": lambda: bool(X.sum() > 0),
    "nonzero": lambda: torch.nonzero(MASK),
    "boolean index": lambda: X[MASK],
    "boolean index_put": lambda: X.clone().__setitem__(MASK, 0.0),
    "masked_select": lambda: torch.masked_select(X, MASK),
    "unique": lambda: torch.unique(X),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_every_read_back_is_counted_and_refused(name):
    with OpCount() as count:
        READS[name]()
    assert count.host_reads == 1, name
    with pytest.raises(HostReadError), no_host_reads():
        READS[name]()


def test_fixed_shape_code_reads_nothing_and_views_are_not_counted():
    def fixed():
        y = torch.where(MASK, X, 0.0)  # the masked values kept in place: no read
        return (y.view(2, 3).T * 2).sum(0)  # view and transpose: not counted

    with OpCount() as count:
        fixed()
    assert count.host_reads == 0 and count.ops == 4  # scalar_tensor (0.0), where, mul, sum
    with no_host_reads():
        fixed()

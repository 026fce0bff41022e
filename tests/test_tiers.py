"""The test tiers cannot drift: a test that runs Snakemake is marked ``slow`` (by
conftest.py when it uses a shared workflow fixture; otherwise it fails), so that
``make test-fast`` (``-m "not slow"``) never runs a workflow."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import conftest
from .helpers import snakemake_cmd


class FakeItem:
    """What the collection hook reads and writes of a test item."""

    def __init__(self, fixturenames: list[str], slow: bool = False):
        self.fixturenames = fixturenames
        self.markers = ["slow"] if slow else []

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None

    def add_marker(self, mark) -> None:
        self.markers.append(mark.name)


def test_a_test_that_uses_a_shared_run_is_marked_slow():
    items = [FakeItem(["tmp_path", name]) for name in sorted(conftest.WORKFLOW_FIXTURES)]
    plain, marked = FakeItem(["tmp_path", "server"]), FakeItem(["load_run"], slow=True)
    conftest.pytest_collection_modifyitems(None, [*items, plain, marked])
    assert all(item.markers == ["slow"] for item in items)
    assert plain.markers == [] and marked.markers == ["slow"]


def test_an_unmarked_test_that_starts_snakemake_fails(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="not marked slow"):
        snakemake_cmd(tmp_path, "-n")


@pytest.mark.slow
def test_a_slow_test_may_start_snakemake(tmp_path):
    cmd = snakemake_cmd(tmp_path, "-n", configfile=tmp_path / "c.yaml")
    assert cmd[1:3] == ["-s", str(Path(conftest.__file__).parents[1] / "Snakefile")]
    assert cmd[-3:] == ["--configfile", str(tmp_path / "c.yaml"), "-n"]


def test_in_this_session_every_test_that_uses_a_shared_run_is_slow(request):
    for item in request.session.items:
        if conftest.WORKFLOW_FIXTURES & set(item.fixturenames):
            assert item.get_closest_marker("slow") is not None, item.nodeid

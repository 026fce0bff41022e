"""Code tracking (crosslip.jobs.tracking): a job's code digest follows the code it imports, and
only its behaviour: docstrings, comments and formatting do not count, paths do not count;
the on-disk cache of digests returns what parsing returns, misses on any edit, and is only
a cache (unreadable, foreign or unwritable, it changes no digest)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from crosslip.jobs import tracking

from .helpers import ROOT

SCRIPTS = ROOT / "workflow" / "scripts"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Each test's own digest cache (``CROSSLIP_CACHE_DIR``), read afresh."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(tracking.CACHE_ENV, str(folder))
    fresh_process()
    yield folder / tracking.CACHE_FILE
    fresh_process()


def fresh_process() -> None:
    """Forget what this process has parsed and read, as a new Snakemake process would."""
    tracking._cache_at.cache_clear()
    tracking._parsed.cache_clear()


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    """A copy of the crosslip package to edit, which the digests then read."""
    copy = tmp_path / "crosslip"
    shutil.copytree(tracking.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(tracking, "PACKAGE_DIR", copy)
    return copy


def digests(*names: str) -> dict[str, str]:
    """The digest of each workflow script (of those ``names`` only, if given)."""
    scripts = [SCRIPTS / f"{n}.py" for n in names] or sorted(SCRIPTS.glob("*.py"))
    return {s.stem: tracking.code_digest(s) for s in scripts}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_closure_follows_imports_transitively_and_takes_parent_packages():
    mods = tracking.module_closure(SCRIPTS / "train.py")
    assert {"crosslip", "crosslip.io", "crosslip.training.single", "crosslip.models"} <= set(mods)
    assert {"crosslip.io.scripts", "crosslip.jobserver.handoff"} <= set(mods)  # run_script's
    assert "crosslip.attacks" in mods  # train -> attacks (adversarial training)
    assert "crosslip.attacks.projections" in mods  # via the package's __init__
    assert "crosslip.certify" not in mods and "crosslip.report" not in mods
    certify = tracking.module_closure(SCRIPTS / "certify.py")
    assert "crosslip.certify.search" in certify and "crosslip.training.single" not in certify
    table = tracking.module_closure(SCRIPTS / "table.py")
    assert "crosslip.report.tables" in table and "torch" not in str(table)
    assert not {"crosslip.training.single", "crosslip.certify", "crosslip.models"} & set(table)
    select = tracking.module_closure(SCRIPTS / "select_models.py")
    assert {"crosslip.families", "crosslip.jobs.selection"} <= set(select)
    assert not {"crosslip.training.single", "crosslip.models", "crosslip.certify"} & set(select)


def test_docstring_comment_and_formatting_edits_change_no_digest(package):
    before = digests()
    net = package / "models" / "softplus_net.py"
    edit(net, '"""Input gradients', '"""Edited: input gradients')
    edit(net, "\nimport torch\n", "\nimport torch  # a new comment\n\n")
    edit(package / "training" / "regularizers.py", "\n\n\n", "\n\n\n\n")
    assert digests() == before


def test_a_code_edit_changes_exactly_the_digests_of_scripts_that_import_it(package):
    before = digests()
    edit(package / "report" / "tables.py", "def read_summary(", "X = 1\n\n\ndef read_summary(")
    after = digests()
    changed = {name for name in before if before[name] != after[name]}
    importers = {
        n
        for n in before
        if "crosslip.report.tables" in tracking.module_closure(SCRIPTS / f"{n}.py")
    }
    assert changed == importers and "train" not in changed and "table" in changed


def test_digest_does_not_depend_on_where_the_checkout_lives(package):
    before = tracking.code_digest(SCRIPTS / "certify.py")
    moved = package.parent / "elsewhere" / "crosslip"
    shutil.copytree(package, moved)
    tracking.PACKAGE_DIR = moved  # the fixture's monkeypatch restores it
    assert tracking.code_digest(SCRIPTS / "certify.py") == before


def test_relative_imports_resolve_against_the_module():
    import ast

    tree = ast.parse("from . import io\nfrom .search import theorem21\nfrom ..models import x\n")
    names = tracking.imported_names(tree, "crosslip.certify.engine", is_package=False)
    assert {
        "crosslip.certify",
        "crosslip.certify.io",
        "crosslip.certify.search",
        "crosslip.models",
        "crosslip.models.x",
    } <= names
    pkg = tracking.imported_names(ast.parse("from .engine import KINDS"), "crosslip.certify", True)
    assert "crosslip.certify.engine" in pkg


#: The cache tests' scripts: one that imports crosslip.report and one that does not (all
#: sixteen, parsed afresh for each case, added 5 s to the fast tier).
SOME = ("table", "train")


def uncached(monkeypatch) -> dict[str, str]:
    monkeypatch.setenv(tracking.CACHE_ENV, "")
    fresh_process()
    return digests(*SOME)


def test_the_disk_cache_returns_what_parsing_returns_and_any_edit_misses(
    package, cache, monkeypatch
):
    cold = digests(*SOME)  # parses, fills the cache
    assert cache.is_file() and json.loads(cache.read_text())["entries"]
    fresh_process()

    def refuse(*args, **kwargs):
        raise AssertionError("parsed although the cache has it")

    with monkeypatch.context() as m:
        m.setattr(tracking.ast, "parse", refuse)
        assert digests(*SOME) == cold  # every digest from the cache, none parsed
    # a code edit misses: the scripts that import it get the digest parsing gives
    fresh_process()
    edit(package / "report" / "tables.py", "def read_summary(", "X = 1\n\n\ndef read_summary(")
    edited = digests(*SOME)
    assert edited["table"] != cold["table"] and edited["train"] == cold["train"]
    with monkeypatch.context() as m:
        assert uncached(m) == edited
    assert uncached(monkeypatch) != cold


def test_a_damaged_or_foreign_cache_is_read_as_empty_and_replaced(cache, monkeypatch):
    want = uncached(monkeypatch)
    monkeypatch.setenv(tracking.CACHE_ENV, str(cache.parent))
    cache.parent.mkdir()
    for content in ("{not json", json.dumps({"python": "2.7", "entries": {}}), "[]"):
        cache.write_text(content)
        fresh_process()
        assert digests(*SOME) == want
        assert json.loads(cache.read_text())["python"] != "2.7"
    # the entries of another Python version are not used: its parser makes other trees
    data = json.loads(cache.read_text())
    cache.write_text(json.dumps({**data, "python": "3.0 (other)"}))
    fresh_process()
    parses = []
    real = ast.parse
    monkeypatch.setattr(tracking.ast, "parse", lambda *a, **k: parses.append(1) or real(*a, **k))
    assert digests(*SOME) == want and parses


def test_an_unwritable_cache_changes_no_digest_and_leaves_no_temporary(
    tmp_path, cache, monkeypatch
):
    want = uncached(monkeypatch)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(tracking.CACHE_ENV, str(blocked / "cache"))  # under a file
    fresh_process()
    assert digests(*SOME) == want
    # a write that fails half-way (here: the rename) leaves no temporary beside the cache
    folder = tmp_path / "failing"
    monkeypatch.setenv(tracking.CACHE_ENV, str(folder))
    fresh_process()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(tracking.os, "replace", fail)
    assert digests(*SOME) == want
    assert list(folder.iterdir()) == []

"""The docs stay true: the results schema in docs/results.md is the code's, every page the
README links exists, and the generated pages are up to date."""

from __future__ import annotations

import re

from crosslip.results_schema import INSTANCE_SCHEMA

from .helpers import ROOT

DOCS = ROOT / "docs"


def documented_columns() -> dict[str, str]:
    """Column -> documented type, from the per-instance schema table of docs/results.md
    (rows like ``| `a`, `b` | string, float64 | meaning |``)."""
    text = (DOCS / "results.md").read_text()
    table = text.split("## Per-instance schema", 1)[1].split("\n\n", 2)[1]
    out = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([a-z0-9_]+)`", cells[0])
        types = [t.strip() for t in cells[1].split(",")]
        types = types * len(names) if len(types) == 1 else types
        assert len(types) == len(names), row
        out.update(zip(names, types, strict=True))
    return out


def test_results_schema_in_the_docs_is_the_codes():
    doc = documented_columns()
    assert list(doc) == INSTANCE_SCHEMA.names  # every column, in the files' order
    for field in INSTANCE_SCHEMA:
        kind = {"string": "string", "double": "float64", "int64": "int64", "bool": "bool"}
        assert doc[field.name] == kind[str(field.type)], field.name


def test_every_linked_page_exists():
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for link in re.findall(r"\]\(([^)#]+\.(?:md|png))\)", page.read_text()):
            if link.startswith("http"):
                continue
            assert (page.parent / link).exists(), f"{page.name} links {link}"


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 120


def test_performance_page_is_generated_from_the_records():
    from benchmarks.perfdoc import render

    assert (DOCS / "performance.md").read_text() == render()


def test_nested_results_become_one_row_per_figure():
    from benchmarks.perfdoc import rows

    result = {
        "machine": "m",
        "tiers": {"fast": {"seconds": 80.123456, "slowest": [{"seconds": 2.5, "test": "t::a"}]}},
        "empty": {},
        "sizes": [1, 2],
    }
    assert rows("", result) == [
        ("machine", "m"),
        ("tiers.fast.seconds", "80.12"),
        ("tiers.fast.slowest[0]", "seconds 2.5, test t::a"),
        ("empty", "`{}`"),
        ("sizes", "`[1, 2]`"),
    ]

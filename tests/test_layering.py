"""The package's structure: no import circle, no import against the layers, and the report
and results schema load without torch.

The import graph is read from the source with ``ast``: every ``import`` and ``from ...
import`` anywhere in a module (also inside functions), relative ones resolved. Importing
``a.b.c`` runs the packages ``a.b`` and ``a`` first, so such an import is also an edge to every
package on the way that does not already contain the importing module.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

SRC = ROOT / "src"
PACKAGE = "crosslip"

#: The package's layers, lowest first: a module may import its own layer and the layers
#: below, never one above. A module is placed by its longest matching name prefix.
LAYERS: list[tuple[str, ...]] = [
    ("crosslip.errors",),  # the expected errors: imports nothing
    (
        "crosslip.norms",
        "crosslip.families",
        "crosslip.io",
        "crosslip.device",
        "crosslip.machine",
        "crosslip.progress",
        "crosslip.jobserver",
    ),  # vocabulary, files and logs, machine, progress lines, the job server (both sides)
    (
        "crosslip.data",
        "crosslip.models.kernels",
        "crosslip.models.softplus",
        "crosslip.kernel_memory",
    ),  # data, the kernel model and its memory plans, the softplus
    ("crosslip.config", "crosslip.jobs"),  # config, job planning
    (
        "crosslip.models",
        "crosslip.models.resnet",
        "crosslip.models.torch_softplus",
        "crosslip.results_schema",
        "crosslip.certified_accuracy",
    ),  # classifiers, schema
    ("crosslip.training.regularizers", "crosslip.certify", "crosslip.attacks"),  # the paper's maths
    (
        "crosslip.training",
        "crosslip.models.checkpoints",
        "crosslip.models.exported",
        "crosslip.models.external",
    ),  # training, model files
    ("crosslip.stages", "crosslip.report", "crosslip.run_summary"),  # stages, tables, figures
    ("crosslip.reproduction",),  # the reproduction record, from the tables
    ("crosslip.pipeline",),  # all stages in one namespace
]

#: Modules that must load without torch (the report's jobs draw tables and figures only).
TORCH_FREE = [
    "crosslip.report",  # with every module of the package (its __init__ imports them all)
    "crosslip.run_summary",
    "crosslip.results_schema",
    "crosslip.certified_accuracy",
    "crosslip.io",  # with its modules (its __init__ imports them all)
    "crosslip.jobserver.server",
    "crosslip.jobserver.handoff",  # a job's process hands off to the server before any import
    "crosslip.machine",
    "crosslip.errors",
    "crosslip.norms",
    "crosslip.families",
    "crosslip.config.validate",  # with the schema, the specs and the grid
    "crosslip.config.reference",
    "crosslip.jobs.selection",
    "crosslip.jobs.tracking",
    "crosslip.kernel_memory",  # the Snakefile checks a config's memory with it
    "crosslip.jobs.resources",
    "crosslip.jobs.batches",  # the Snakefile plans the training jobs with it
    "crosslip.jobs.files",
    "crosslip.stages.parquet",
    "crosslip.stages.instances",  # a job per model: torch's start-up would double it
]


def module_names(src: Path, package: str) -> dict[str, Path]:
    """``dotted name -> file`` for every module of ``package`` under ``src`` (a package's
    ``__init__.py`` is the package's name)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    """``module -> modules of the package it imports`` (see the module docstring)."""
    modules = module_names(src, package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]  # the package `.` refers to
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base_name = ".".join(base + ([node.module] if node.module else []))
                else:
                    base_name = node.module or ""
                for alias in node.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{base_name}.{alias.name}"
                    targets.add(sub if sub in modules else base_name)
        own = set(_ancestors(name))
        for target in targets:
            if target not in modules:
                continue  # another distribution (torch, numpy, ...)
            implied = [a for a in _ancestors(target) if a in modules and a not in own]
            graph[name].update(t for t in [target, *implied] if t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One closed path ``[a, b, ..., a]`` for each strongly connected component with more
    than one module (Tarjan's algorithm), or a module that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, comp) for comp in components]


def _closed_path(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest path from ``comp[0]`` back to itself inside the component."""
    start, members = comp[0], set(comp)
    paths = {w: [start, w] for w in sorted(graph[start]) if w in members}
    frontier = list(paths)
    while start not in paths:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w in members and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return paths[start]


def strongly_connected(graph: dict[str, set[str]], start: str) -> list[str]:
    """The modules that ``start`` reaches and that reach ``start``."""

    def reach(edges: dict[str, set[str]]) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for w in edges[todo.pop()]:
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    reverse: dict[str, set[str]] = {v: set() for v in graph}
    for v, targets in graph.items():
        for w in targets:
            reverse[w].add(v)
    return sorted(reach(graph) & reach(reverse))


def layer_of(module: str) -> int | None:
    """The layer of ``module`` (the package's ``__init__``, which only names the package,
    is at the bottom), or None if it is in none."""
    if module == PACKAGE:
        return 0
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    return level


# --------------------------------------------------------------------------------------
# The checker itself: it must find what it is meant to find.
# --------------------------------------------------------------------------------------


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_a_circle_through_a_function_level_relative_import(tmp_path):
    src = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from .b import g\n",
            "b.py": "def g():\n    from . import a  # lazy\n    return a\n",
            "c.py": "import pkg.a\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_checker_counts_the_packages_that_an_import_runs_first(tmp_path):
    """``io`` importing ``data.fetch`` runs ``data/__init__``; when that imports ``io``, the
    two import each other although no file names the other's module directly."""
    src = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "io.py": "def run():\n    from .data.fetch import Err\n",
            "data/__init__.py": "from ..io import run\nfrom .fetch import Err\n",
            "data/fetch.py": "class Err(Exception):\n    pass\n",
            "data/mnist.py": "from .fetch import Err\nfrom ..data import fetch\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.io"] == {"pkg.data", "pkg.data.fetch"}
    assert graph["pkg.data.mnist"] == {"pkg.data.fetch"}  # its own package is no edge
    assert find_cycles(graph) == [["pkg.data", "pkg.io", "pkg.data"]]


def test_checker_finds_a_package_and_its_submodule_importing_each_other(tmp_path):
    src = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "data/__init__.py": "class Dataset:\n    pass\n\nfrom . import mnist\n",
            "data/mnist.py": "from . import Dataset\n",
        },
    )
    assert find_cycles(import_graph(src, "pkg")) == [["pkg.data", "pkg.data.mnist", "pkg.data"]]


def test_checker_passes_an_acyclic_package(tmp_path):
    src = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "base.py": "import math\n",
            "top.py": "from . import base\nfrom .base import math\nimport pkg.base as b\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph == {"pkg": set(), "pkg.base": set(), "pkg.top": {"pkg.base"}}
    assert find_cycles(graph) == []


# --------------------------------------------------------------------------------------
# The package
# --------------------------------------------------------------------------------------


def test_package_has_no_import_circle():
    graph = import_graph(SRC, PACKAGE)
    assert len(graph) > 30 and sum(map(len, graph.values())) > 60  # the whole package read
    cycles = find_cycles(graph)
    report = [
        f"{' -> '.join(c)}  (the circle's modules: {strongly_connected(graph, c[0])})"
        for c in cycles
    ]
    assert not cycles, "import circles:\n" + "\n".join(report)


def test_every_module_imports_only_its_own_layer_or_below():
    graph = import_graph(SRC, PACKAGE)
    unplaced = sorted(m for m in graph if layer_of(m) is None)
    assert not unplaced, f"place these modules in LAYERS of {Path(__file__).name}: {unplaced}"
    upward = [
        f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if layer_of(t) > layer_of(m)
    ]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_stages_and_report_are_imported_by_no_library_module():
    graph = import_graph(SRC, PACKAGE)
    top = ("crosslip.pipeline", "crosslip.report")

    def inside(module: str) -> bool:
        return any(module == t or module.startswith(t + ".") for t in top)

    users = sorted(m for m, targets in graph.items() if not inside(m) and any(map(inside, targets)))
    assert users == []


def test_the_report_package_imports_and_re_exports_every_public_name_of_its_modules():
    """``from crosslip.report import NAME`` works for every public name of its modules (the
    same object), so importing the package loads every module (TORCH_FREE checks them)."""
    import importlib

    report = importlib.import_module("crosslip.report")
    for path in sorted((SRC / "crosslip" / "report").glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(f"crosslip.report.{path.stem}")
        names = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        public = sorted(n for n in names if not n.startswith("_"))
        assert public and set(public) <= set(report.__all__), path.name
        assert all(getattr(report, n) is getattr(module, n) for n in public), path.name


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_loads_without_torch(module):
    """In a fresh interpreter, importing the module leaves torch unloaded."""
    code = (
        f"import sys, {module}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'crosslip'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    torch_modules, crosslip_modules = proc.stdout.splitlines()
    assert torch_modules == "[]", f"{module} loads torch via {crosslip_modules}"
    assert module in crosslip_modules  # the module itself was imported


def test_the_layer_table_of_the_architecture_page_is_these_layers():
    """docs/architecture.md's table names every module of :data:`LAYERS` in its layer's row
    (a package as ``name/``, a module of a package as ``pkg/module`` or ``pkg/`` (``module``)),
    top layer first."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page.split("## Package layers", 1)[1]
    rows = [r for r in table.splitlines() if re.match(r"^\| \d+ \|", r)]
    assert [int(r.split("|")[1]) for r in rows] == list(range(len(LAYERS)))[::-1]
    for layer, modules in enumerate(LAYERS):
        cell = rows[len(LAYERS) - 1 - layer].split("|")[2]  # the modules column
        for name in modules:
            path = name.removeprefix("crosslip.").replace(".", "/")
            parent, _, last = path.rpartition("/")
            token = f"`{path}/`" if (SRC / "crosslip" / path).is_dir() else f"`{path}`"
            listed = parent and f"`{parent}/` (" in cell and f"`{last}`" in cell  # pkg (`module`)
            assert token in cell or listed, (token, cell)
        # and nothing else: every name outside parentheses is a module of the layer
        for token in re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cell)):
            assert "crosslip." + token.rstrip("/").replace("/", ".") in modules, (token, layer)

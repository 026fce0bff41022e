"""Which code a workflow job runs, as a digest that changes exactly when that code does.

Snakemake reruns a job when its ``params`` change. Each rule passes
``code_digest(<its script>)`` as a param: the SHA-256 of the script and of every module of the
``crosslip`` package that it imports, directly or through other modules (found by parsing the
``import`` statements, function-level ones included, with the parent packages that Python
executes on the way). The digest is taken over each module's syntax tree with its docstrings
removed, so an edit of a comment, a docstring or the formatting reruns nothing, while any
change of what the code does reruns the jobs that import it and no others. Paths enter only
relative to the package, so a project moved or cloned elsewhere, with its results, has
nothing to do.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = "crosslip"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def module_file(name: str, root: Path | None = None) -> Path | None:
    """The file of the package module ``name`` (``crosslip.certify.search``) below ``root``
    (default: this package's folder), or None if it is not a module of the package (e.g. a
    name imported from a module)."""
    root = PACKAGE_DIR if root is None else root
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [PACKAGE, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, current: str | None, is_package: bool) -> set[str]:
    """Absolute names of the modules (and of the names in ``from`` imports) that ``tree``
    imports anywhere, relative imports resolved against the module ``current``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if current is None:
                    continue
                parts = current.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of every module, class and function removed (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


@functools.cache
def _parsed(path: Path, mtime_ns: int, root: Path) -> tuple[str, frozenset[str]]:
    """(normalized syntax tree, imported names) of one file; cached per modification time."""
    inside = path.is_relative_to(root)  # a package module, else a script
    current = _module_name(path, root) if inside else None
    tree = ast.parse(path.read_text(), filename=str(path))
    names = imported_names(tree, current, path.name == "__init__.py")
    dump = ast.dump(strip_docstrings(tree), annotate_fields=False, include_attributes=False)
    return dump, frozenset(names)


def _parse(path: Path, root: Path | None = None) -> tuple[str, frozenset[str]]:
    root = PACKAGE_DIR if root is None else root
    return _parsed(path, path.stat().st_mtime_ns, root)


def module_closure(script: Path | str, root: Path | None = None) -> dict[str, Path]:
    """Module name -> file, for every ``crosslip`` module that running ``script`` imports
    (from the package folder ``root``, default: this package's)."""
    root = PACKAGE_DIR if root is None else root
    seen: dict[str, Path] = {}
    todo = list(_parse(Path(script), root)[1])
    while todo:
        for name in _with_parents(todo.pop()):
            if name in seen:
                continue
            path = module_file(name, root)
            if path is None:
                continue
            seen[name] = path
            todo.extend(_parse(path, root)[1])
    return dict(sorted(seen.items()))


def code_digest(script: Path | str, root: Path | str | None = None) -> str:
    """SHA-256 (hex, first 16 digits) of ``script`` and the ``crosslip`` modules it imports
    from the package folder ``root`` (default: this package's; the workflow passes the
    ``src/crosslip`` beside its Snakefile), over their syntax trees without docstrings (see
    the module docstring)."""
    root = PACKAGE_DIR if root is None else Path(root).resolve()
    h = hashlib.sha256()
    h.update(_parse(Path(script), root)[0].encode())
    for name, path in module_closure(script, root).items():
        h.update(f"\0{name}\0".encode())
        h.update(_parse(path, root)[0].encode())
    return h.hexdigest()[:16]

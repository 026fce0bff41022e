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

Parsing the package's modules takes about 0.4 s of CPU, in every Snakemake start (each
rule's params) and every SLURM job (which parses the workflow again). So each digest is
also kept in a small cache on disk (:class:`DigestCache`), under the SHA-256 of the exact
contents of the files it covers, with their module names and the Python version: a digest
is a function of those alone, so a hit returns what parsing would, and any edit misses.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "crosslip"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: The cache's folder; empty: no cache. Default ``$XDG_CACHE_HOME/crosslip`` (or
#: ``~/.cache/crosslip``).
CACHE_ENV = "CROSSLIP_CACHE_DIR"
CACHE_FILE = "code-digests.json"
#: The cache keeps the entries of this many most recent digests and file parses.
CACHE_ENTRIES = 2000
log = logging.getLogger(__name__)


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


def module_closure(
    script: Path | str, root: Path | None = None, cache: DigestCache | None = None
) -> dict[str, Path]:
    """Module name -> file, for every ``crosslip`` module that running ``script`` imports
    (from the package folder ``root``, default: this package's); the imported names of
    each file from ``cache`` where it has them."""
    root = PACKAGE_DIR if root is None else root
    names = cache.names if cache is not None else (lambda path, root: _parse(path, root)[1])
    seen: dict[str, Path] = {}
    todo = list(names(Path(script), root))
    while todo:
        for name in _with_parents(todo.pop()):
            if name in seen:
                continue
            path = module_file(name, root)
            if path is None:
                continue
            seen[name] = path
            todo.extend(names(path, root))
    return dict(sorted(seen.items()))


def code_digest(script: Path | str, root: Path | str | None = None) -> str:
    """SHA-256 (hex, first 16 digits) of ``script`` and the ``crosslip`` modules it imports
    from the package folder ``root`` (default: this package's; the workflow passes the
    ``src/crosslip`` beside its Snakefile), over their syntax trees without docstrings (see
    the module docstring). Kept in the on-disk cache (:func:`digest_cache`)."""
    root = PACKAGE_DIR if root is None else Path(root).resolve()
    script = Path(script)
    cache = digest_cache()
    closure = module_closure(script, root, cache)
    key = hashlib.sha256(cache.file_key(script, root).encode())
    for name, path in closure.items():
        key.update(f"\0{name}\0{cache.file_key(path, root)}".encode())
    found = cache.digest(key.hexdigest())
    if found is not None:
        cache.save()  # names found on the way
        return found
    h = hashlib.sha256()
    h.update(_parse(script, root)[0].encode())
    for name, path in closure.items():
        h.update(f"\0{name}\0".encode())
        h.update(_parse(path, root)[0].encode())
    digest = h.hexdigest()[:16]
    cache.store(key.hexdigest(), digest)
    cache.save()
    return digest


def cache_dir() -> Path | None:
    """The folder of the digest cache: ``$CROSSLIP_CACHE_DIR`` (empty: none), else
    ``$XDG_CACHE_HOME/crosslip``, else ``~/.cache/crosslip``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "crosslip"


@dataclass
class DigestCache:
    """Code digests and each file's imported names, under the SHA-256 of what they are a
    function of: the exact bytes of the files, their module names (relative imports resolve
    against them) and the Python version (its parser makes the syntax trees). Read from
    ``path`` once; :meth:`save` writes back what was read and what was added, by an atomic
    replace, so a reader never sees a half-written file, and an entry that another process
    wrote meanwhile may be lost (it is computed again). A cache that cannot be read is
    treated as empty, one that cannot be written is only not written: it changes how fast
    a digest comes, never what it is."""

    path: Path | None
    entries: dict[str, object] = field(default_factory=dict)
    _keys: dict[tuple[Path, int, int, Path], str] = field(default_factory=dict)
    _changed: bool = False

    @classmethod
    def load(cls, path: Path | None) -> DigestCache:
        cache = cls(path)
        try:
            data = json.loads(path.read_text()) if path is not None else {}
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict) and data.get("python") == sys.version:
            entries = data.get("entries")
            cache.entries = entries if isinstance(entries, dict) else {}
        return cache

    def file_key(self, path: Path, root: Path) -> str:
        """SHA-256 of the file's bytes, its module name (none for a script) and the Python
        version; per process, remembered for the file's size and modification time."""
        st = path.stat()
        memo = (path, st.st_mtime_ns, st.st_size, root)
        if memo not in self._keys:
            module = _module_name(path, root) if path.is_relative_to(root) else ""
            h = hashlib.sha256(f"{sys.version}\0{module}\0{path.name}\0".encode())
            h.update(path.read_bytes())
            self._keys[memo] = h.hexdigest()
        return self._keys[memo]

    def names(self, path: Path, root: Path) -> frozenset[str]:
        """The names ``path`` imports (:func:`imported_names`), parsed on a miss."""
        key = f"names:{self.file_key(path, root)}"
        found = self.entries.get(key)
        if isinstance(found, list) and all(isinstance(n, str) for n in found):
            return frozenset(found)
        names = _parse(path, root)[1]
        self._put(key, sorted(names))
        return names

    def digest(self, key: str) -> str | None:
        found = self.entries.get(f"digest:{key}")
        return found if isinstance(found, str) else None

    def store(self, key: str, digest: str) -> None:
        self._put(f"digest:{key}", digest)

    def _put(self, key: str, value: object) -> None:
        self.entries.pop(key, None)
        self.entries[key] = value  # the newest last; the oldest go first
        while len(self.entries) > CACHE_ENTRIES:
            self.entries.pop(next(iter(self.entries)))
        self._changed = True

    def save(self) -> None:
        """Write the entries back if they changed (atomic replace; see the class)."""
        if self.path is None or not self._changed:
            return
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump({"python": sys.version, "entries": self.entries}, f)
            os.replace(tmp, self.path)
            self._changed = False
        except OSError as err:
            log.debug("code digest cache %s not written: %s", self.path, err)
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


@functools.cache
def _cache_at(path: Path | None) -> DigestCache:
    return DigestCache.load(path)


def digest_cache() -> DigestCache:
    """This process's digest cache, read once from :func:`cache_dir`."""
    folder = cache_dir()
    return _cache_at(folder / CACHE_FILE if folder is not None else None)

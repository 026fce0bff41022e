"""A restricted unpickler for the numpy arrays inside dataset pickles (CIFAR-10's batches).

``pickle.load`` runs whatever callable a file names, so an untrusted pickle can execute code.
:func:`load_restricted` resolves every global of the stream from a fixed table holding only
what a plain numpy array needs (``_reconstruct``, ``ndarray``, ``dtype``, and
``_codecs.encode``, which Python 3 protocol-2 pickles use for byte strings) and raises
:class:`UnsafePickleError` for anything else before it can be called (``os.system``,
``builtins.eval``, ``subprocess.Popen``, ...). Nothing is imported by name from the file.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DataFormatError

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]


class UnsafePickleError(DataFormatError, pickle.UnpicklingError):
    """A pickle refers to a global outside the allow-list of :mod:`crosslip.data.unpickle`."""


def _latin1_encode(obj: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` limited to the text -> bytes use that pickles make of it."""
    if codecs.lookup(encoding).name != "iso8859-1":
        raise UnsafePickleError(f"refused to call _codecs.encode with encoding {encoding!r}")
    return codecs.encode(obj, "latin-1")


#: (module, name) as written in the stream -> the object it may stand for.
ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,  # numpy < 2 and Python 2 files
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,  # numpy >= 2
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


def _describe(module: str, name: str) -> str:
    """``module.name``, with the Python 3 name that a Python 2 name in the stream stands for."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        py3 = ".".join(_compat_pickle.NAME_MAPPING[(module, name)])
    else:
        py3 = f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}"
    written = f"{module}.{name}"
    return written if py3 == written else f"{py3} (written {written})"


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler whose ``find_class`` only answers :data:`ALLOWED_GLOBALS`."""

    def __init__(self, file: io.BufferedIOBase, source: str, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"{self.source}: refused to load the global {_describe(module, name)}; a dataset "
                "pickle may only hold numpy arrays, so this file is not genuine: delete it and "
                "fetch the official one"
            ) from None


def load_restricted(data: bytes, source: str, encoding: str = "bytes") -> Any:
    """Unpickle ``data`` allowing only numpy arrays, lists, dicts, numbers and strings.

    ``source`` names the file in error messages; ``encoding="bytes"`` keeps Python 2 ``str``
    objects (dictionary keys such as ``b"data"``) as ``bytes``. Raises
    :class:`UnsafePickleError` for a forbidden global and :class:`DataFormatError` for a
    stream that is not a valid pickle.
    """
    unpickler = RestrictedUnpickler(io.BytesIO(data), source, encoding=encoding)
    try:
        return unpickler.load()
    except UnsafePickleError as exc:
        if str(exc).startswith(f"{source}:"):
            raise
        raise UnsafePickleError(f"{source}: {exc}") from None
    except Exception as exc:  # any malformed stream: truncated, bad opcode, bad state, ...
        raise DataFormatError(f"{source}: not a readable pickle ({exc})") from exc

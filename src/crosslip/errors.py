"""The errors a user can fix, all derived from :class:`CrosslipError`.

An expected error says in one line which file, key or value is wrong and what to do;
:func:`crosslip.io.scripts.run_script` logs exactly these as that one line. Any other
exception is a bug and keeps its full traceback in the job's log.

Each class also derives from the built-in exception that callers caught before this base
existed (``ValueError``, ``RuntimeError``, ``KeyError``), so ``except ValueError`` still
sees a bad value.

This module imports nothing, so that every layer of the package (data, models, config,
report) can raise these errors without importing another layer.
"""

from __future__ import annotations


class CrosslipError(Exception):
    """Base of the expected errors: bad input that the user can fix, with a one-line
    message naming the file, key or value and what to do."""


class ConfigError(CrosslipError, ValueError):
    """A configuration value (or a training hyperparameter built from it) is not allowed."""


class DataUnavailableError(CrosslipError, RuntimeError):
    """A dataset file could not be found in a mirror or cache, nor downloaded."""


class ChecksumError(CrosslipError, RuntimeError):
    """A dataset file's content does not match its published checksum."""


class DataFormatError(CrosslipError, ValueError):
    """A dataset file (or a member of an archive) is not in the documented format."""


class UnknownDatasetError(CrosslipError, KeyError):
    """A dataset name that no loader is registered under."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ModelFileError(CrosslipError, ValueError):
    """A file given as a model is not a crosslip weights file (or would run code)."""


class UnsupportedModelError(CrosslipError, TypeError):
    """A model whose layers crosslip has no guarantee for (the message lists the supported
    shapes)."""

"""``python -m crosslip.config``: print docs/configuration.md (:mod:`.reference`)."""

from .reference import reference_markdown

print(reference_markdown(), end="")

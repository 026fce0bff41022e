"""Progress of long loops (training, certification, attacks) that one can watch.

Everything goes through the ``logging`` logger ``"crosslip"`` at level INFO:

* plain lines, for log files: one at every tenth of the work (and at least every
  :data:`LOG_SECONDS` seconds while it runs), with the units done, the rate and the time;
* a live ``tqdm`` bar on stderr, only when stderr is a terminal (the workflow's console
  handler, :func:`crosslip.io.logs.setup_logging`, then leaves the plain progress lines to
  the log file and shows the bar instead).

Used as a library, crosslip stays silent: when nobody configured logging, INFO is not
enabled for ``"crosslip"`` and a :class:`Progress` neither logs nor draws a bar. Set the
environment variable ``TQDM_DISABLE=1`` to keep a terminal free of bars.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any

LOG = logging.getLogger("crosslip")
#: The most seconds between two plain progress lines while a loop runs.
LOG_SECONDS = 60.0
#: ``extra`` of a plain progress line: a console handler that shows a bar drops these.
PROGRESS_RECORD = {"crosslip_progress": True}
#: The record attribute that names the model a line is about, where one job trains several
#: (:func:`crosslip.io.logs.setup_logging` sends such lines to that model's log file only).
TAG = "crosslip_model"


def is_progress_record(record: logging.LogRecord) -> bool:
    """Whether ``record`` is a plain progress line (which a live bar replaces)."""
    return bool(getattr(record, "crosslip_progress", False))


def enabled() -> bool:
    """Whether progress is reported at all: INFO enabled for the ``"crosslip"`` logger."""
    return LOG.isEnabledFor(logging.INFO)


def bar_wanted(stream: Any = None) -> bool:
    """A live bar: when ``stream`` (stderr by default) is a terminal and ``TQDM_DISABLE``
    is not set."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
        return False
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d} min"


def _width() -> dict[str, Any]:
    """tqdm's width: the terminal's, followed as it changes; 100 columns where the terminal
    reports none (a pseudo-terminal without a size, where tqdm would draw nothing)."""
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    return {"dynamic_ncols": True} if columns > 0 else {"ncols": 100, "nrows": 20}


class Progress:
    """Progress of a loop over ``total`` units (points, batches, epochs, iterations).

    ``what`` names the loop in every line (e.g. ``"certify"``), ``unit`` the units
    (plural). :meth:`update` after each unit or batch of units; a line is logged when the
    done fraction crosses a multiple of ``every`` (0.1: ten lines), when
    :data:`LOG_SECONDS` passed since the last line, and at :meth:`close` if the loop
    stopped early. Lines read
    ``certify: 512/1000 points (51%), 230.1 points/s, 2.2 s elapsed, ~2.1 s left``
    followed by the ``postfix`` of :meth:`update`. :meth:`advance_bar` moves the bar by a
    fraction of a unit without a line (e.g. per batch within an epoch; ``fractional=True``
    shows such positions, 2.56/4.00). ``active=False``
    (e.g. an attack inside an adversarial-training step) reports nothing. ``tag``: the
    model the lines are about (:data:`TAG`), in a job that trains several; ``bar=False``:
    lines only. Use as a context manager (closes the bar).
    """

    def __init__(
        self,
        what: str,
        total: int,
        unit: str,
        every: float = 0.1,
        active: bool = True,
        fractional: bool = False,
        tag: str | None = None,
        bar: bool = True,
    ) -> None:
        self.what, self.total, self.unit = what, int(total), unit
        self.active = active and self.total > 0 and enabled()
        self.extra = PROGRESS_RECORD if tag is None else {**PROGRESS_RECORD, TAG: tag}
        self.step = max(1, math.ceil(round(every * self.total, 9)))  # 1/n * n may be 1 + 2e-16
        self.done = self.logged = 0
        self.shown = 0.0  # the bar's position (fractions included)
        self.next_mark = self.step
        self.t0 = self.last_line = time.perf_counter()
        self.bar = None
        if self.active and bar and bar_wanted():
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                desc=what,
                unit=unit.rstrip("s") or unit,
                file=sys.stderr,
                leave=False,
                unit_scale=fractional,
                **_width(),
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance_bar(self, fraction: float) -> None:
        """Move the bar (only) by ``fraction`` of a unit."""
        if self.bar is not None:
            self.shown += fraction
            self.bar.update(fraction)

    def update(self, n: int = 1, **postfix: Any) -> None:
        """``n`` more units done; ``postfix`` (e.g. ``loss=0.1``) is shown on the bar and
        appended to the line."""
        if not self.active:
            return
        self.done += int(n)
        now = time.perf_counter()
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            delta = self.done - self.shown
            self.bar.update(int(delta) if delta == int(delta) else delta)
            self.shown = float(self.done)
        due = self.done >= self.next_mark or self.done >= self.total
        if due or now - self.last_line >= LOG_SECONDS:
            while self.next_mark <= self.done:
                self.next_mark += self.step
            self._line(now, postfix)

    def _line(self, now: float, postfix: dict[str, Any]) -> None:
        self.last_line, self.logged = now, self.done
        elapsed = now - self.t0
        rate = self.done / elapsed if elapsed > 0 else math.inf
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        extra = "".join(
            f", {k} {v:.4g}" if isinstance(v, float) else f", {k} {v}" for k, v in postfix.items()
        )
        LOG.info(
            "%s: %d/%d %s (%.0f%%), %.4g %s/s, %s elapsed, ~%s left%s",
            self.what,
            self.done,
            self.total,
            self.unit,
            100 * self.done / self.total,
            rate,
            self.unit,
            _duration(elapsed),
            _duration(left),
            extra,
            extra=self.extra,
        )

    def close(self, **postfix: Any) -> None:
        """Close the bar; log a last line if the loop stopped before a logged line."""
        if self.active and self.done != self.logged:
            self._line(time.perf_counter(), postfix)
        if self.bar is not None:
            self.bar.close()
            self.bar = None

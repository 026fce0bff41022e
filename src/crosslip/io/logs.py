"""Logging of workflow jobs (each line names its job; a job's models each get their own log
file) and the failure reports read back from the log files (a failed job's one-line reason)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path


class _ConsoleHandler(logging.StreamHandler):
    """stderr handler of a workflow job: on a terminal, it writes through ``tqdm`` (so that
    a live progress bar stays below the lines) and leaves the plain progress lines
    (:mod:`crosslip.progress`) to the log file, the bar showing them instead."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        from ..progress import bar_wanted

        self.terminal = bar_wanted(self.stream)

    def filter(self, record: logging.LogRecord) -> bool:
        from ..progress import is_progress_record

        if self.terminal and is_progress_record(record):
            return False
        return bool(super().filter(record))

    def emit(self, record: logging.LogRecord) -> None:
        if not self.terminal:
            super().emit(record)
            return
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def job_tag(log_file: str | Path | None) -> str:
    """A short name of a job for its lines on the terminal, from its log file: the path
    below the last ``logs`` folder without ``.log`` (``train/mnist5k/none-lr0.2-lam0-seed0``)."""
    if not log_file:
        return ""
    parts = Path(str(log_file).removesuffix(".log")).parts
    if "logs" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("logs") :])
    return parts[-1]


#: The model that the lines logged now are about, in a job that handles several
#: (:func:`about_model`); a line's own tag (:data:`crosslip.progress.TAG`) comes first.
_CURRENT_MODEL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "crosslip_model", default=None
)


@contextlib.contextmanager
def about_model(model_id: str) -> Iterator[None]:
    """Every line logged inside is about ``model_id``: in a job that handles several models,
    it goes to that model's log file only (:func:`setup_logging`)."""
    token = _CURRENT_MODEL.set(model_id)
    try:
        yield
    finally:
        _CURRENT_MODEL.reset(token)


def _model_of(record: logging.LogRecord) -> str | None:
    from ..progress import TAG

    return getattr(record, TAG, None) or _CURRENT_MODEL.get()


class _OneModel(logging.Filter):
    """Lets through the lines about ``model`` and the lines about no model in particular
    (a job that trains several models writes each one's log)."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model

    def filter(self, record: logging.LogRecord) -> bool:
        return _model_of(record) in (None, self.model)


class _JobFormatter(logging.Formatter):
    """Names the job on each line (``[train/mnist5k/<model>]``), or the model a line is
    about where the job has several."""

    def __init__(self, job: str) -> None:
        super().__init__("%(asctime)s %(levelname)s [%(job)s]: %(message)s")
        self.job = job

    def format(self, record: logging.LogRecord) -> str:
        model = _model_of(record)
        record.job = f"{self.job.rsplit('/', 1)[0]}/{model}" if model else self.job
        return super().format(record)


def log_files(log_file: str | Path | Sequence[str | Path] | None) -> list[Path]:
    """A job's log files as a list (none, one, or one per model it trains)."""
    if log_file is None:
        return []
    if isinstance(log_file, str | Path):
        return [Path(log_file)]
    return [Path(f) for f in log_file]


def setup_logging(log_file: str | Path | Sequence[str | Path] | None) -> logging.Logger:
    """Send log records to ``log_file`` and stderr.

    On stderr every line names the job (:func:`job_tag`), since the lines of jobs that run
    side by side meet on one terminal; on a terminal, progress shows as a live bar
    (:mod:`crosslip.progress`) instead of its plain lines, which the log file keeps.
    Several log files (a job that trains several models, one log each, named
    ``<model>.log``): a line about one model (:data:`crosslip.progress.TAG`) goes to that
    model's file only, every other line to all of them.
    """
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    files = log_files(log_file)
    console = _ConsoleHandler()
    tag = job_tag(files[0]) if files else ""
    if len(files) > 1:
        tag = f"{tag.rsplit('/', 1)[0]}/{len(files)} models" if "/" in tag else tag
    console.setFormatter(_JobFormatter(tag) if tag else logging.Formatter(fmt))
    handlers: list[logging.Handler] = [console]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="w"))
        handlers[-1].setFormatter(logging.Formatter(fmt))
        if len(files) > 1:
            handlers[-1].addFilter(_OneModel(path.name.removesuffix(".log")))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
    return logging.getLogger("crosslip")


#: A record line of :func:`setup_logging`'s format: date, time, level, logger, message.
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \S+ (?P<level>[A-Z]+) (?P<name>\S+): (?P<msg>.*)$")


def failure_reason(log_file: str | Path) -> str:
    """One line saying why a job failed, from its log file (the format of
    :func:`~crosslip.io.scripts.run_script`): the message of the last ERROR record (a
    message of several lines joined into one), or for an unexpected error the last line of
    its traceback (the exception); for a log that ends in an ordinary record (the job was
    stopped from outside, by a kill, a time limit or a node failure, or its outputs went
    missing), that and its last message; else the log's last line (``Killed``); else that
    the job failed before its script wrote a line (e.g. the submission to a cluster failed,
    which Snakemake's own message explains)."""
    path = Path(log_file)
    try:
        lines = [ln.rstrip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log file: it failed before its script ran (see Snakemake's message)"
    lines = [ln for ln in lines if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        rec = _RECORD.match(lines[i])
        if rec and rec["level"] in ("ERROR", "CRITICAL"):
            after = []
            for ln in lines[i + 1 :]:
                if _RECORD.match(ln):
                    break
                after.append(ln.strip())
            if "Traceback (most recent call last):" in after:
                return f"{rec['msg']}: {after[-1]}"
            return " ".join([rec["msg"].strip(), *after])
    if not lines:
        return "nothing in its log: it failed before its script ran (see Snakemake's message)"
    if last := _RECORD.match(lines[-1]):
        return (
            "no error in its log: stopped from outside (killed, a time limit, a node failure) "
            f"or its outputs went missing, see Snakemake's message; its last line: {last['msg']}"
        )
    return lines[-1].strip()


def failure_lines(jobs: list[tuple[str, str, list[str]]]) -> list[str]:
    """The lines printed on the terminal when a workflow run fails: per failed job
    ``(rule, wildcards, log files)`` the rule, wildcards, one-line reason
    (:func:`failure_reason` of its first log file) and where the log is."""
    if not jobs:
        return []
    out = [f"crosslip: {len(jobs)} job(s) failed:"]
    for rule, wildcards, logs in jobs:
        where = f" ({wildcards})" if wildcards else ""
        if logs:
            out.append(f"  {rule}{where}: {failure_reason(logs[0])}  [log: {logs[0]}]")
        else:
            out.append(f"  {rule}{where}: failed (the rule has no log file)")
    return out


def recent_failed_logs(folder: str | Path, since: float) -> list[tuple[str, str, list[str]]]:
    """Failed jobs found from their log files, where the workflow engine does not say which
    jobs failed: every ``*.log`` under ``folder`` written at or after ``since`` (a
    ``time.time()``) that holds an ERROR record, as ``(rule, wildcards, [log])`` with the
    rule and wildcards read from the path below ``folder`` (``<rule>/<wildcards>.log``)."""
    found = []
    for log in sorted(Path(folder).rglob("*.log")):
        try:
            if log.stat().st_mtime < since:
                continue
            text = log.read_text(errors="replace")
        except OSError:
            continue
        if any((m := _RECORD.match(ln)) and m["level"] == "ERROR" for ln in text.splitlines()):
            rel = log.relative_to(folder).as_posix().removesuffix(".log")
            rule, _, rest = rel.partition("/")
            found.append((rule, rest, [str(log)]))
    return found

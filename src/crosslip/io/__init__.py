"""Files, logs and the running of workflow scripts, torch-free: atomic writes, JSON and the
arrays of .npz files (:mod:`.files`), a job's logging and the failure reports read from its
log files (:mod:`.logs`), and :func:`run_script`, which every workflow script calls
(:mod:`.scripts`). Each public name is also here: ``from crosslip.io import run_script``.

Every workflow job's process imports this package before it hands its job to the job
server (:mod:`crosslip.jobserver`): it and its modules import the standard library and
crosslip's light modules only."""

from .files import atomic_dir, atomic_path, read_json, read_npz_array, write_json
from .logs import (
    about_model,
    failure_lines,
    failure_reason,
    job_tag,
    log_files,
    recent_failed_logs,
    setup_logging,
)
from .scripts import run_script

__all__ = [
    "about_model",
    "atomic_dir",
    "atomic_path",
    "failure_lines",
    "failure_reason",
    "job_tag",
    "log_files",
    "read_json",
    "read_npz_array",
    "recent_failed_logs",
    "run_script",
    "setup_logging",
    "write_json",
]

"""``python -m crosslip.reproduction {export,render}``: see :mod:`crosslip.reproduction`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .export import ExportError, export_run, machine_from_text
from .record import RECORD_NAME, render, write_record


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m crosslip.reproduction", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    # the export options' dests are export_run's parameters
    ex = sub.add_parser("export", help="copy a finished run into docs/reproduction/<name>/")
    ex.add_argument("--results", required=True, help="the run's results folder")
    ex.add_argument("--name", required=True, help="run name (folder under docs/reproduction/)")
    ex.add_argument(
        "--config",
        dest="configs",
        required=True,
        nargs="+",
        help="the --configfile file(s) the run used, in order",
    )
    ex.add_argument("--command", required=True, help="the exact command that ran it")
    ex.add_argument(
        "--machine",
        type=machine_from_text,
        help="the machine that ran it, as text or a YAML mapping {cpu, logical_cpus, "
        "memory_gib, gpu, software} (default: this machine's CPU, memory and GPU)",
    )
    ex.add_argument(
        "--wall-time", dest="wall_time_s", type=float, help="elapsed seconds of the run, if known"
    )
    ex.add_argument(
        "--commit",
        help="a run made elsewhere: the commit it ran at, unchanged (default: this HEAD)",
    )
    ex.add_argument(
        "--ran-on",
        dest="results_written",
        help="a run made elsewhere: when it ran (default: the time summary.csv was written)",
    )
    ex.add_argument(
        "--benchmark",
        dest="benchmarks",
        nargs="+",
        default=[],
        help="outputs of benchmarks/*.py run on the same machine (kept in run.yaml)",
    )
    ex.add_argument(
        "--weights",
        nargs="+",
        default=[],
        metavar="MODEL_ID",
        help="models whose files to keep under models/<model id>.pt (their SHA-256 in "
        "run.yaml), so that they can be certified again without training",
    )
    ex.add_argument(
        "--pool",
        help="a label shared by runs the record evaluates as one (same settings, other models)",
    )
    ex.add_argument("--docs", default="docs", help="docs folder (default: docs)")
    ex.add_argument("--force", action="store_true", help="replace an existing run folder")
    re_ = sub.add_parser("render", help=f"regenerate docs/{RECORD_NAME} from docs/reproduction/")
    re_.add_argument("--docs", default="docs", help="docs folder (default: docs)")
    re_.add_argument(
        "--check",
        action="store_true",
        help=f"only check that docs/{RECORD_NAME} is up to date (exit 1 if not)",
    )
    args = vars(parser.parse_args(argv))
    if args.pop("cmd") == "export":
        try:
            dest = export_run(**args)
        except ExportError as err:
            print(f"crosslip.reproduction export: {err}", file=sys.stderr)
            return 2
        print(f"exported {dest}; now run: python -m crosslip.reproduction render")
        return 0
    if args["check"]:
        path = Path(args["docs"]) / RECORD_NAME
        if not path.is_file() or path.read_text() != render(args["docs"]):
            print(
                f"{path} is not what `make record` renders from {args['docs']}/reproduction/: "
                "run `make record` and commit it",
                file=sys.stderr,
            )
            return 1
        print(f"{path} is up to date")
        return 0
    print(f"wrote {write_record(args['docs'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

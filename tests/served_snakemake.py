"""The ``snakemake`` command, run in a fork of the tests' job server when one is named.

``python tests/served_snakemake.py ARGS`` is ``snakemake ARGS``: this process hands itself
to the job server of :data:`crosslip.jobserver.handoff.ENV` (as a workflow job does), and the fork,
which has imported Snakemake and crosslip once, runs this file from its first line. Without
a server, or where the server refuses, it runs Snakemake itself. Either way the process
that the test started passes on signals and ends with Snakemake's exit status.
"""

import os
import sys

from crosslip.jobserver.handoff import hand_off

hand_off()

from pathlib import Path  # noqa: E402

from snakemake import PIP_DEPLOYMENTS_PATH  # noqa: E402
from snakemake.cli import main  # noqa: E402  (before snakemake.workflow: a circular import)
from snakemake.workflow import Workflow  # noqa: E402

# As the snakemake command: its path (Snakemake prints the command) and its folder on
# sys.path (not the tests' folder). In a fork, the imports above were made in the server:
# what Snakemake does at import is done again here for this process, the folder of pip
# deployments on sys.path and the run directory of its header.
sys.argv[0] = str(Path(sys.executable).parent / "snakemake")
sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))
if PIP_DEPLOYMENTS_PATH not in sys.path:
    sys.path.append(PIP_DEPLOYMENTS_PATH)
Workflow._rundir = str(Path.cwd().absolute())
sys.exit(main())

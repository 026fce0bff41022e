"""``python -m crosslip.jobserver -- COMMAND``: run a command (Snakemake) whose jobs fork
from a job server (:func:`crosslip.jobserver.server.main`)."""

import sys

# through the imported module: one copy of its state, whoever imports it
from crosslip.jobserver.server import main

sys.exit(main())

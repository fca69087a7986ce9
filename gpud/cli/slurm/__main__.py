"""``python -m gpud.cli.slurm COMMAND ARGS...``: one Slurm command over gpud's API."""

import sys

from gpud.cli.slurm import main

sys.exit(main())

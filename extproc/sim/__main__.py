"""`python -m extproc.sim`: the same as `extproc sim`."""

import sys

from extproc.sim.cli import main

sys.exit(main())

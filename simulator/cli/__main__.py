"""python -m simulator.cli: the stepsim command."""

import sys

from . import main

sys.exit(main())

"""python -m stepsim: the stepsim command."""

import sys

from . import program

sys.exit(program())

"""python -m stepsim: the stepsim command."""

import sys

from .cli import program

sys.exit(program())

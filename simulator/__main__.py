"""python -m stepsim: the stepsim command."""

import sys

from .cli import main

sys.exit(main())

"""python -m stepsim: the stepsim command."""

import sys

from . import main

sys.exit(main())

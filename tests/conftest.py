import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # lets the suite run from a checkout without installing
    sys.path.insert(0, str(ROOT))

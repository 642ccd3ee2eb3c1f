"""Type-check simulator/, schedules/ and topologies/ as the one package they install as.

The three folders install as ``stepsim``, ``stepsim.schedules`` and
``stepsim.topologies`` (pyproject.toml's package-dir), a mapping mypy cannot be told.
This lays them out under that name in a temporary folder, as symbolic links to the
checkout's own files (nothing copied, nothing written in the checkout), runs mypy
there with pyproject.toml's settings, and prints its findings with the checkout's
paths. Exit status: mypy's.

    python tools/typecheck.py                 # the whole package
    python tools/typecheck.py stepsim.cost    # one room (and what it imports)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# where each folder of the checkout sits under the package name
LAYOUT = {
    "simulator": "stepsim",
    "schedules": "stepsim/schedules",
    "topologies": "stepsim/topologies",
}


def lay_out(into: Path) -> None:
    """Link every file of the three folders to its place under ``into``."""
    for folder, package in LAYOUT.items():
        for source in sorted((ROOT / folder).rglob("*.py")):
            target = into / package / source.relative_to(ROOT / folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(source, target)


def main(argv: list[str]) -> int:
    packages = argv or ["stepsim"]
    with tempfile.TemporaryDirectory(prefix="stepsim-typecheck-") as tmp:
        farm = Path(tmp)
        lay_out(farm)
        cache = ROOT / ".mypy_cache"
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        command += ["--cache-dir", str(cache)]
        for package in packages:
            command += ["-p", package]
        done = subprocess.run(command, cwd=farm, capture_output=True, text=True, check=False)
    # stepsim/schedules/x.py -> schedules/x.py, stepsim/x.py -> simulator/x.py
    back = [(re.escape(package) + "/", folder + "/") for folder, package in LAYOUT.items()]
    back.sort(key=lambda pair: -len(pair[0]))
    for line in (done.stdout + done.stderr).splitlines():
        for pattern, folder in back:
            if re.match(pattern, line):
                line = re.sub("^" + pattern, folder, line)
                break
        print(line)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""matplotlib is imported where a picture is drawn, not with the modules that draw them:
`stepsim compare` without --png, `calibrate --trace`, a sweep or a topology without a
picture never load it (its import takes a good part of a second); nor does the module
that writes --out folders (`figure_png` imports it when it draws)."""

import subprocess
import sys


def test_the_picture_modules_do_not_import_matplotlib():
    code = (
        "import sys\n"
        "import stepsim.report.compare, stepsim.report.figures, stepsim.report.timeline\n"
        "import stepsim.report.trace, stepsim.run.idlemap, stepsim.cli.outfolder\n"
        "print('matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""``python -m stepsim.scenario`` prints the key tables of scenarios/README.md,
generated from the specs (tests/test_schema.py checks the README holds them);
``--write README`` replaces the tables in that file (the key tables in order, the jobs
file's, and the framework defaults table)."""

import sys
from pathlib import Path

from . import frameworks, jobfile
from .schema import keys, markdown_table, markdown_tables

if len(sys.argv) == 3 and sys.argv[1] == "--write":
    readme = Path(sys.argv[2])
    lines = readme.read_text(encoding="utf-8").splitlines()
    # the scenario sections' tables in order, then the jobs file's [[job]] table
    tables = iter([*(markdown_table(section) for section in keys()), jobfile.markdown_table()])
    out, i = [], 0
    while i < len(lines):
        table = None
        if lines[i].startswith("| Key | Type |"):
            table = next(tables)
        elif lines[i].startswith("| Key | megatron"):
            table = frameworks.markdown_table()
        if table is None:
            out.append(lines[i])
            i += 1
            continue
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        out.append(table)
    readme.write_text("\n".join(out) + "\n", encoding="utf-8")
else:
    print(markdown_tables(), end="")

"""``python -m simulator.scenario`` prints the key tables of scenarios/README.md,
generated from the specs (tests/test_schema.py checks the README holds them);
``--write README`` replaces the tables in that file (the same headings, in order)."""

import sys
from pathlib import Path

from .schema import keys, markdown_table, markdown_tables

if len(sys.argv) == 3 and sys.argv[1] == "--write":
    readme = Path(sys.argv[2])
    lines = readme.read_text(encoding="utf-8").splitlines()
    tables = iter(markdown_table(section) for section in keys())
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("| Key | Type |"):
            while i < len(lines) and (
                lines[i].startswith("|") or lines[i][:7] in ("<<<<<<<", "=======", ">>>>>>>")
            ):
                i += 1
            out.append(next(tables))
            continue
        out.append(lines[i])
        i += 1
    readme.write_text("\n".join(out) + "\n", encoding="utf-8")
else:
    print(markdown_tables(), end="")

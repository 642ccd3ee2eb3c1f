"""``python -m simulator.scenario`` prints the key tables of scenarios/README.md,
generated from the specs (tests/test_schema.py checks the README holds them)."""

from .schema import markdown_tables

print(markdown_tables(), end="")

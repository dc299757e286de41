"""Quarantine: every private name of another package the gateway uses, one module per package.

Nothing else in the gateway touches a private name of another package. `tests/unit/test_internals.py`
fails, naming the symbol, when an upgrade of that package removes or renames one.
"""

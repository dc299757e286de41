"""The Manifold benchmark: fixtures, a wrk-based load generator, and the scenario runner (`python -m bench`)."""

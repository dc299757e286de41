"""Manifold: an MCP aggregating gateway."""

__version__ = "0.1.0"

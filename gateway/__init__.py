"""Manifold: an MCP aggregating gateway."""

__version__ = "0.1.0"
SERVER_INFO = {"name": "manifold", "version": __version__}  # the gateway's identity, stamped on what it serves

"""The `manifold` command: serve, check, tools, login (an upstream OAuth flow) and worker (serve local
stdio servers to a remote gateway)."""

"""The benchmark's peer: FastMCP's proxy in front of one upstream, served over streamable HTTP at /mcp.

Run with the peer venv's Python (bench/peer.py makes it): ``python bench/peer_fastmcp.py --port P
(--url URL | -- COMMAND ARGS...)``. The proxy is FastMCP's documented `create_proxy(target)`, with its default
session strategy (a fresh backend client per request; a stdio backend's process is kept alive between them).

It is served the way the benchmark serves its fixtures: JSON answers (``json_response=True``), uvicorn without
access logs, on uvloop and httptools when they are installed, no banner and no update check. This file imports
nothing from the project.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from functools import partial

os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")

import anyio
from fastmcp.client.transports import StdioTransport  # type: ignore[import-not-found]  # peer venv only
from fastmcp.server import create_proxy  # type: ignore[import-not-found]  # peer venv only


def main() -> None:
    p = argparse.ArgumentParser(description="FastMCP proxy in front of one upstream (benchmark peer).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--url", help="the upstream's streamable HTTP URL")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the upstream's stdio command and arguments")
    args = p.parse_args()
    command = [c for c in args.command if c != "--"] if args.command else []
    if bool(args.url) == bool(command):
        p.error("give either --url or a stdio command after --")
    target = args.url or StdioTransport(command=command[0], args=command[1:])
    proxy = create_proxy(target, name="peer")
    http = "httptools" if importlib.util.find_spec("httptools") else "auto"
    run = partial(
        proxy.run_async,
        transport="http",
        show_banner=False,
        host=args.host,
        port=args.port,
        path="/mcp",
        log_level="WARNING",
        json_response=True,
        uvicorn_config={"access_log": False, "http": http, "backlog": 4096},
    )
    anyio.run(run, backend_options={"use_uvloop": importlib.util.find_spec("uvloop") is not None})


if __name__ == "__main__":
    main()

"""Fixture upstreams for the benchmark: `echo` plus N dummy tools, over stdio or streamable HTTP.

Run: ``python bench/fixture.py --transport stdio|http [--kind lowlevel|mcpserver] [--stateless] [--port P]
[--tools N] [--sleep-ms MS] [--result-bytes B] [--name NAME]``.

Two kinds of server with the same tools:

- ``lowlevel`` (the default): a lean server on the SDK's low-level `Server`, with as little per-call work as
  the SDK allows: the tool list and schemas are built once, `get_tool_input_schema` is set (so 2026-era
  calls never re-list), the OpenTelemetry middleware is dropped, and stdio is read and written on the event
  loop instead of through the SDK's worker threads.
- ``mcpserver``: the same tools written the way most Python MCP servers are, on the SDK's high-level
  `MCPServer`: decorated functions with typed parameters, the SDK's default middleware, and the SDK's own
  stdio transport (`run_stdio_async`). Its `echo` is declared `-> str`, so its answers carry the text twice,
  as content and as structured content (`{"result": ...}`), as any such server's do.

Over HTTP, ``lowlevel`` answers with plain JSON bodies (`json_response=True`) and ``mcpserver`` with the
SDK's default, an event stream per answer. Both have the Host/Origin check off (loopback only), and run
uvicorn without access logs, on uvloop and httptools when they are installed (stdio runs on uvloop too).

- ``--stateless`` (HTTP only): the SDK's stateless mode, `stateless_http=True` with `json_response=True`, as
  deployed servers often run: no `Mcp-Session-Id` is issued, and every 2025-era request is served on a fresh
  transport of its own (the SDK's `_handle_stateless_request`); 2026-era requests take the same single-exchange
  path as in the stateful mode. Over stdio there is no such mode: the same server serves its one connection.

- ``--tools N``: N dummy tools besides ``echo`` (``tool_0001`` ...), so the listing has N + 1 tools.
- ``--sleep-ms MS``: ``echo`` sleeps that long before answering.
- ``--result-bytes B``: ``echo`` answers with a text of B bytes instead of its argument.
- ``--modern-sleep-ms MS`` and ``--tag-era`` (for the gateway's tests of the era it learns to speak): ``echo``
  sleeps MS more when asked in the 2026 era, and names the era it was asked in under ``_meta["bench/era"]``.

This file is run as a script by the benchmark and by the gateway (as a stdio upstream); it imports nothing
from the project.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
from collections.abc import Mapping
from typing import Annotated, Any, cast

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.server import MCPServer, Server, ServerRequestContext
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field
from starlette.applications import Starlette

KINDS = ("lowlevel", "mcpserver")

ECHO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "The text to return."}},
    "required": ["text"],
}
DUMMY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"value": {"type": "string", "description": "Ignored."}},
}
READ_ONLY = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True)


def dummy_name(i: int) -> str:
    """The name of the i-th dummy tool (1-based)."""
    return f"tool_{i:04d}"


def build_server(
    name: str, n_tools: int, sleep_ms: float, result_bytes: int, modern_sleep_ms: float = 0.0, tag_era: bool = False
) -> Server[Any]:
    """The fixture server: one fixed listing, an `echo` handler, no per-call model building beyond the SDK's."""
    tools = [types.Tool(name="echo", description="Return the text.", input_schema=ECHO_SCHEMA, annotations=READ_ONLY)]
    tools += [
        types.Tool(name=dummy_name(i), description=f"Dummy tool number {i}.", input_schema=DUMMY_SCHEMA)
        for i in range(1, n_tools + 1)
    ]
    schemas: dict[str, Mapping[str, Any]] = {t.name: t.input_schema for t in tools}
    listing = types.ListToolsResult(tools=tools)
    big_text = "x" * result_bytes if result_bytes else None
    delay = sleep_ms / 1000.0
    modern_delay = modern_sleep_ms / 1000.0

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        return listing

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        tool = params.name
        if tool == "echo":
            if delay:
                await anyio.sleep(delay)
            if modern_delay and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                await anyio.sleep(modern_delay)
            text = big_text if big_text is not None else str((params.arguments or {}).get("text", ""))
        elif tool in schemas:
            text = tool
        else:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {tool}")
        # A plain dict skips one model round trip in the runner; 2026-era results must carry resultType.
        result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
        if tag_era:
            result["_meta"] = {"bench/era": ctx.protocol_version}
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            result["resultType"] = "complete"
        return result

    server: Server[Any] = Server(
        name,
        version="0.1.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=schemas.get,
    )
    server.middleware = []  # the default OpenTelemetry middleware costs CPU on every request
    return server


def build_mcpserver(name: str, n_tools: int, sleep_ms: float, result_bytes: int) -> MCPServer[Any]:
    """The same tools on the high-level `MCPServer`, written as a server author would write them."""
    mcp = MCPServer(name, version="0.1.0", log_level="WARNING")
    big_text = "x" * result_bytes if result_bytes else None
    delay = sleep_ms / 1000.0

    @mcp.tool(annotations=READ_ONLY)
    async def echo(text: Annotated[str, Field(description="The text to return.")]) -> str:
        """Return the text."""
        if delay:
            await anyio.sleep(delay)
        return big_text if big_text is not None else text

    def dummy(i: int) -> Any:
        async def tool(value: Annotated[str, Field(description="Ignored.")] = "") -> str:
            return dummy_name(i)

        return tool

    for i in range(1, n_tools + 1):
        mcp.tool(name=dummy_name(i), description=f"Dummy tool number {i}.")(dummy(i))
    return mcp


def http_app(server: Server[Any] | MCPServer[Any], host: str, *, sse: bool, stateless: bool = False) -> Starlette:
    """The streamable HTTP app at /mcp: answers as JSON bodies or (`sse`, the SDK's default) as event streams,
    no Host/Origin check, no session limits; `stateless`: the SDK's stateless mode (no sessions)."""
    from mcp.server.transport_security import TransportSecuritySettings

    return server.streamable_http_app(
        streamable_http_path="/mcp",
        json_response=not sse,
        stateless_http=stateless,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        host=host,
        session_idle_timeout=None,
        max_sessions=None,
    )


def serve_http(app: Starlette, host: str, port: int) -> None:
    """Serve an app with uvicorn, as fast as its options allow."""
    import uvicorn

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        loop=loop,
        http=http,
        lifespan="on",
        backlog=4096,
    )


class _PipeLines:
    """stdin as an async iterator of text lines, read on the event loop (not in a worker thread)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _PipeLines:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode()


class _PipeWriter:
    """stdout as the async text file the SDK's stdio server writes to, on the event loop."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode())

    async def flush(self) -> None:
        await self._writer.drain()


async def serve_stdio(server: Server[Any]) -> None:
    """Serve one connection on stdin/stdout.

    The SDK's `stdio_server` reads and writes the real stdin/stdout through worker threads (a thread hop
    per line); handing it pipe streams on the event loop keeps the fixture's own cost per call low, so the
    gateway's stdio rows measure the gateway.
    """
    from mcp.server.stdio import stdio_server

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    lines, out = cast(Any, _PipeLines(reader)), cast(Any, _PipeWriter(writer))
    async with stdio_server(lines, out) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    """Parse the command line and serve."""
    p = argparse.ArgumentParser(description="Benchmark fixture upstream.")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--kind", choices=KINDS, default="lowlevel", help="low-level Server or high-level MCPServer")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default="bench")
    p.add_argument("--tools", type=int, default=10, help="dummy tools besides echo")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="echo sleeps this long")
    p.add_argument("--result-bytes", type=int, default=0, help="echo returns a text this long")
    p.add_argument("--stateless", action="store_true", help="HTTP: stateless_http=True (no sessions), JSON answers")
    p.add_argument("--modern-sleep-ms", type=float, default=0.0, help="echo sleeps this much more in the 2026 era")
    p.add_argument("--tag-era", action="store_true", help="echo names the era it was asked in (_meta bench/era)")
    args = p.parse_args()
    uvloop = {"use_uvloop": importlib.util.find_spec("uvloop") is not None}
    if args.kind == "mcpserver":
        mcp = build_mcpserver(args.name, args.tools, args.sleep_ms, args.result_bytes)
        if args.transport == "http":
            serve_http(http_app(mcp, args.host, sse=True), args.host, args.port)
        else:
            anyio.run(mcp.run_stdio_async, backend_options=uvloop)
        return
    server = build_server(args.name, args.tools, args.sleep_ms, args.result_bytes, args.modern_sleep_ms, args.tag_era)
    if args.transport == "http":
        serve_http(http_app(server, args.host, sse=False, stateless=args.stateless), args.host, args.port)
    else:
        anyio.run(serve_stdio, server, backend_options=uvloop)


if __name__ == "__main__":
    main()

"""A real MCP client (the SDK's `mcp.Client`) for the container checks in `.ci/container.sh`.

    python tests/container/mcp_check.py URL list [--era auto|legacy] [--expect NAME ...]
    python tests/container/mcp_check.py URL call TOOL JSON_ARGS [--era ...] [--expect-text TEXT]

Waits up to `--timeout` seconds for the listing to contain every `--expect` name (the gateway
connects to its upstreams in the background), prints what it saw, and exits 1 on any mismatch.
The bearer token comes from `MANIFOLD_TOKEN`.
Only the standard library and `mcp` are needed, so it also runs inside the upstream service's
container (`docker compose exec -T upstream python - URL ... < tests/container/mcp_check.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def names(client: Client) -> list[str]:
    result = await client.list_tools()
    return [t.name for t in result.tools]


async def run(args: argparse.Namespace) -> int:
    token = os.environ.get("MANIFOLD_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(args.url, http_client=http), mode=args.era) as client,
    ):
        version = client.session.protocol_version
        seen: list[str] = []
        with anyio.move_on_after(args.timeout):
            while True:
                seen = await names(client)
                if all(n in seen for n in args.expect):
                    break
                await anyio.sleep(0.5)
        print(f"protocol {version}; {len(seen)} tools: {', '.join(seen)}")
        missing = [n for n in args.expect if n not in seen]
        if missing:
            print(f"missing tools: {', '.join(missing)}", file=sys.stderr)
            return 1
        if args.command == "list":
            return 0
        arguments: dict[str, Any] = json.loads(args.arguments)
        result = await client.call_tool(args.tool, arguments)
        text = "".join(getattr(c, "text", "") for c in result.content)
        meta = result.meta or {}
        print(f"{args.tool} -> isError={result.is_error} text={text!r} server={meta.get('manifold/server')!r}")
        if result.is_error:
            return 1
        if args.expect_text is not None and text != args.expect_text:
            print(f"expected text {args.expect_text!r}", file=sys.stderr)
            return 1
        return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--era", default="auto", help="Client mode: auto (newest the server offers) or legacy")
    p.add_argument("--timeout", type=float, default=30)
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list")
    ls.add_argument("--expect", nargs="*", default=[])
    call = sub.add_parser("call")
    call.add_argument("tool")
    call.add_argument("arguments")
    call.add_argument("--expect", nargs="*", default=[])
    call.add_argument("--expect-text", default=None)
    args = p.parse_args()
    if args.command == "call" and args.tool not in args.expect:
        args.expect.append(args.tool)
    sys.exit(anyio.run(run, args))


if __name__ == "__main__":
    main()

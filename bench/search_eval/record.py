"""Record the tool listings of real MCP servers into catalog.json (run once, by hand; tests and CI never run it).

The servers are installed in a scratch folder outside the repository:

    mkdir -p SCRATCH/npm && cd SCRATCH/npm && npm init -y && \\
        PUPPETEER_SKIP_DOWNLOAD=1 npm install --legacy-peer-deps PACKAGE...     # the npm packages below
    python3 -m venv SCRATCH/py && SCRATCH/py/bin/pip install PACKAGE...        # the PyPI packages below

(a server whose `home` is set goes in that folder instead, e.g. SCRATCH/npm-extra or a SCRATCH/py1 venv with
`mcp<2`, where its dependencies would clash with the others'; the redis server needs `redis-server` on PATH),

then `python -m bench.search_eval.record --root SCRATCH` launches each one over stdio with dummy credentials,
lists its tools through the SDK's client and writes catalog.json: per server, the name an operator would give
it, the package and its version, and its tools exactly as listed (name, title, description, inputSchema,
annotations). `--only NAME` re-records one server and keeps the others from the existing catalog.

Tried and left out: @stripe/mcp (only relays to a remote endpoint), @supabase/mcp-server-supabase (asks its
API before it lists), @heroku/mcp-server (does not load against the SDK it installs) and @azure-devops/mcp
(needs a native keychain module); @aashari/mcp-server-atlassian-jira lists five generic REST verbs and would
only duplicate mcp-atlassian's Jira tools.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

HERE = Path(__file__).resolve().parent
CATALOG = HERE / "catalog.json"
KEEP = ("name", "title", "description", "inputSchema", "annotations")


@dataclass(frozen=True)
class Server:
    """One server to launch: `bin` is an npm package's executable or a console script of the PyPI venv."""

    name: str
    package: str
    registry: str  # "npm" or "pypi"
    bin: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    home: str = ""  # the folder under the scratch root it is installed in: "npm" / "py" unless it clashes


DUMMY = "dummy-token-for-listing-only"
SERVERS = (
    Server(
        "github",
        "@modelcontextprotocol/server-github",
        "npm",
        "mcp-server-github",
        env={"GITHUB_PERSONAL_ACCESS_TOKEN": DUMMY},
    ),
    Server(
        "gitlab",
        "@zereight/mcp-gitlab",
        "npm",
        "mcp-gitlab",
        env={"GITLAB_PERSONAL_ACCESS_TOKEN": DUMMY, "GITLAB_API_URL": "http://127.0.0.1:9/api/v4"},
    ),
    Server(
        "slack",
        "@modelcontextprotocol/server-slack",
        "npm",
        "mcp-server-slack",
        env={"SLACK_BOT_TOKEN": "xoxb-" + DUMMY, "SLACK_TEAM_ID": "T00000000"},
    ),
    Server("fs", "@modelcontextprotocol/server-filesystem", "npm", "mcp-server-filesystem", args=("{scratch}",)),
    Server("playwright", "@playwright/mcp", "npm", "playwright-mcp", args=("--headless",)),
    Server("puppeteer", "@modelcontextprotocol/server-puppeteer", "npm", "mcp-server-puppeteer"),
    Server("notion", "@notionhq/notion-mcp-server", "npm", "notion-mcp-server", env={"NOTION_TOKEN": DUMMY}),
    Server("sentry", "@sentry/mcp-server", "npm", "sentry-mcp", args=("--access-token", DUMMY)),
    Server("k8s", "mcp-server-kubernetes", "npm", "mcp-server-kubernetes"),
    Server(
        "memory",
        "@modelcontextprotocol/server-memory",
        "npm",
        "mcp-server-memory",
        env={"MEMORY_FILE_PATH": "{scratch}/memory.json"},
    ),
    Server(
        "brave",
        "@modelcontextprotocol/server-brave-search",
        "npm",
        "mcp-server-brave-search",
        env={"BRAVE_API_KEY": DUMMY},
    ),
    Server(
        "postgres",
        "@modelcontextprotocol/server-postgres",
        "npm",
        "mcp-server-postgres",
        args=("postgresql://127.0.0.1:9/none",),
    ),
    Server(
        "redis",
        "@modelcontextprotocol/server-redis",
        "npm",
        "mcp-server-redis",
        args=("redis://127.0.0.1:{redis_port}",),
    ),
    Server(
        "maps",
        "@modelcontextprotocol/server-google-maps",
        "npm",
        "mcp-server-google-maps",
        env={"GOOGLE_MAPS_API_KEY": DUMMY},
    ),
    Server("docs", "@upstash/context7-mcp", "npm", "context7-mcp"),
    Server("desktop", "@wonderwhy-er/desktop-commander", "npm", "desktop-commander"),
    Server("mongodb", "mongodb-mcp-server", "npm", "mongodb-mcp-server", home="npm-extra"),
    Server(
        "airtable",
        "airtable-mcp-server",
        "npm",
        "airtable-mcp-server",
        env={"AIRTABLE_API_KEY": DUMMY},
        home="npm-extra",
    ),
    Server(
        "figma",
        "figma-developer-mcp",
        "npm",
        "figma-developer-mcp",
        args=("--stdio",),
        env={"FIGMA_API_KEY": DUMMY},
        home="npm-extra",
    ),
    Server("git", "mcp-server-git", "pypi", "mcp-server-git"),
    Server("fetch", "mcp-server-fetch", "pypi", "mcp-server-fetch"),
    Server("time", "mcp-server-time", "pypi", "mcp-server-time", args=("--local-timezone", "UTC")),
    Server(
        "sqlite", "mcp-server-sqlite", "pypi", "mcp-server-sqlite", args=("--db-path", "{scratch}/eval.db"), home="py1"
    ),
    Server(
        "atlassian",
        "mcp-atlassian",
        "pypi",
        "mcp-atlassian",
        env={
            "JIRA_URL": "http://127.0.0.1:9",
            "JIRA_USERNAME": "a@example.com",
            "JIRA_API_TOKEN": DUMMY,
            "CONFLUENCE_URL": "http://127.0.0.1:9/wiki",
            "CONFLUENCE_USERNAME": "a@example.com",
            "CONFLUENCE_API_TOKEN": DUMMY,
        },
        home="py1",
    ),
)


@dataclass(frozen=True)
class Place:
    """Where the servers live and what their arguments may refer to."""

    root: Path
    redis_port: int

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    def fill(self, text: str) -> str:
        return text.replace("{scratch}", str(self.scratch)).replace("{redis_port}", str(self.redis_port))

    def home(self, server: Server) -> Path:
        return self.root / (server.home or ("npm" if server.registry == "npm" else "py"))


def command(server: Server, place: Place) -> tuple[str, list[str]]:
    args = [place.fill(a) for a in server.args]
    home = place.home(server)
    if server.registry == "npm":
        pkg_dir = home / "node_modules" / server.package
        bins = json.loads((pkg_dir / "package.json").read_text()).get("bin")
        rel = bins if isinstance(bins, str) else bins[server.bin]
        return "node", [str((pkg_dir / rel).resolve()), *args]
    return str(home / "bin" / server.bin), args


def version(server: Server, place: Place) -> str:
    home = place.home(server)
    if server.registry == "npm":
        return str(json.loads((home / "node_modules" / server.package / "package.json").read_text())["version"])
    code = f"import importlib.metadata as m; print(m.version({server.package!r}))"
    out = subprocess.run([str(home / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


async def list_tools(server: Server, place: Place, timeout: float) -> list[dict[str, Any]]:
    cmd, args = command(server, place)
    env = {k: place.fill(v) for k, v in server.env.items()}
    params = StdioServerParameters(command=cmd, args=args, env=env, cwd=str(place.scratch))
    tools: list[dict[str, Any]] = []
    with anyio.fail_after(timeout):
        async with AsyncExitStack() as stack:
            errlog = stack.enter_context((place.scratch / f"{server.name}.log").open("w"))
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            session = await stack.enter_async_context(ClientSession(read, write, read_timeout_seconds=timeout))
            await session.initialize()
            cursor: str | None = None
            while True:
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
                for tool in page.tools:
                    wire = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
                    tools.append({k: wire[k] for k in KEEP if k in wire})
                cursor = page.next_cursor
                if cursor is None:
                    break
    return tools


def start_redis(scratch: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A throwaway redis-server on a free loopback port (the redis server connects before it lists tools)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(scratch)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    return proc, port


async def record(root: Path, only: set[str], timeout: float) -> int:
    (root / "scratch").mkdir(parents=True, exist_ok=True)
    redis, redis_port = start_redis(root / "scratch")
    try:
        return await _record(Place(root, redis_port), only, timeout)
    finally:
        redis.terminate()
        redis.wait(5)


async def _record(place: Place, only: set[str], timeout: float) -> int:
    old = {s["name"]: s for s in json.loads(CATALOG.read_text())["servers"]} if only and CATALOG.exists() else {}
    out: list[dict[str, Any]] = []
    failed = 0
    for server in SERVERS:
        if only and server.name not in only:
            if server.name in old:
                out.append(old[server.name])
            continue
        try:
            tools = await list_tools(server, place, timeout)
        except Exception as exc:  # any failure: report it and go on with the next server
            failed += 1
            print(f"{server.name:<11} FAILED: {exc!r}"[:300], file=sys.stderr)
            continue
        if not tools:
            failed += 1
            print(f"{server.name:<11} listed no tools", file=sys.stderr)
            continue
        entry = {
            "name": server.name,
            "package": server.package,
            "registry": server.registry,
            "version": version(server, place),
            "tools": tools,
        }
        out.append(entry)
        print(f"{server.name:<11} {server.package}@{entry['version']}: {len(tools)} tools")
    catalog = {
        "about": "Tool listings of real MCP servers, recorded by bench/search_eval/record.py; not edited by hand.",
        "servers": out,
    }
    CATALOG.write_text(json.dumps(catalog, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {CATALOG}: {len(out)} servers, {sum(len(s['tools']) for s in out)} tools")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.search_eval.record", description=__doc__)
    parser.add_argument("--root", type=Path, required=True, help="scratch folder holding npm/ and py/")
    parser.add_argument("--only", action="append", default=[], help="re-record this server only (repeatable)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per server")
    args = parser.parse_args(argv)
    return anyio.run(record, args.root.resolve(), set(args.only), args.timeout)


if __name__ == "__main__":
    sys.exit(main())

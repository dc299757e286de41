"""The compatibility corpus: real MCP servers from npm and PyPI, pinned, and what each must do behind the gateway.

One entry per server: the package and version (pinned by `package-lock.json` and the `requirements-*.lock`
files beside this module), the SDK it is built on, the protocol revision it negotiates with the gateway, its
transport, how to launch it, how many tools, prompts, resources and resource templates it offers (as the
server itself lists them to a client that declares what the gateway declares), and one call with the answer
that counts as the server's own.

Credentials are dummies and there is no network: a call whose answer is the server's report of a failed
connection counts, as long as it is the server's answer (`tool_error` or `server_error` with the server's
words), never the gateway's refusal.

Launch commands are argument lists with placeholders, filled by the test:

- `{node}`: Node 22 (tests/thirdparty's), `{modules}`: this folder's `node_modules`, `{loopback}`: the
  preload that binds a host-less `listen()` to 127.0.0.1
- `{mcp1}`, `{fastmcp}`, `{mcp2}`: the `bin` folder of the corpus virtualenv of that name (`.venvs/NAME`);
  `{project}`: the project's own virtualenv
- `{work}`: a scratch folder (HOME of every server, a git repository at `{work}/repo`, a kubeconfig, ...)
- `{port}`: a free loopback port (HTTP servers, which the test starts itself); `{redis}`: a redis URL
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Transport = Literal["stdio", "http", "sse"]
Expect = Literal["ok", "tool_error", "server_error"]

# SDK generations, as the README's table names them.
TS_0 = "TypeScript SDK 0.x (2024)"
TS_1_0 = "TypeScript SDK 1.0 (late 2024)"
TS_1_X = "TypeScript SDK 1.x (current 1.x)"
TS_2 = "TypeScript SDK 2.x"
PY_1 = "Python mcp 1.x"
FASTMCP_3 = "FastMCP 3 (on mcp 1.x)"
PY_2 = "Python mcp 2.x"
FASTMCP_4 = "FastMCP 4 (on mcp 2.x)"

HANDSHAKE_2024 = "2024-11-05"
HANDSHAKE_2025 = "2025-11-25"
MODERN = "2026-07-28"


@dataclass(frozen=True)
class Call:
    """The one call made through the gateway, and the answer that counts as the server's own.

    `ok`: a result without `isError`; `tool_error`: a result with `isError` whose text is the server's;
    `server_error`: a JSON-RPC error the server itself answered with (`code`). `text` is a fragment of the
    server's words that must be in the answer (empty: any text, or none).
    """

    tool: str
    arguments: dict[str, Any]
    expect: Expect
    text: str = ""
    code: int | None = None


@dataclass(frozen=True)
class Server:
    """One server of the corpus."""

    name: str
    package: str
    version: str
    registry: Literal["npm", "PyPI"]
    sdk: str  # the SDK and its version, as installed
    generation: str  # one of the generations above
    protocol: str  # what it negotiates with the gateway (`server/discover`, else `initialize`)
    transport: Transport
    launch: tuple[str, ...]
    call: Call
    tools: int
    prompts: int = 0
    resources: int = 0
    templates: int = 0
    env: dict[str, str] = field(default_factory=dict)
    path: str = "/mcp"  # HTTP servers: the endpoint's path
    headers: dict[str, str] = field(default_factory=dict)  # HTTP servers: sent by the gateway
    needs: tuple[str, ...] = ()  # services the test must provide ("redis")
    one_client: bool = False  # HTTP servers: serves one client, and exits when it leaves
    degraded: tuple[str, ...] = ()  # listings it fails to give, which the gateway serves without
    note: str = ""


NODE = "{node}"
MODULES = "{modules}"


def node(script: str, *args: str) -> tuple[str, ...]:
    return (NODE, f"{MODULES}/{script}", *args)


def node_loopback(script: str, *args: str) -> tuple[str, ...]:
    return (NODE, "--require", "{loopback}", f"{MODULES}/{script}", *args)


NET_FAILED = "fetch failed"
ATLASSIAN_ENV = {
    "JIRA_URL": "https://jira.example.invalid",
    "JIRA_USERNAME": "corpus@example.invalid",
    "JIRA_API_TOKEN": "dummy-jira-token",
    "CONFLUENCE_URL": "https://confluence.example.invalid/wiki",
    "CONFLUENCE_USERNAME": "corpus@example.invalid",
    "CONFLUENCE_API_TOKEN": "dummy-confluence-token",
    # Over HTTP it refuses a request that carries no user's credentials unless the configured ones may serve it.
    "ALLOW_GLOBAL_CRED_FALLBACK": "true",
}
NOTION_BEARER = "corpus-notion-http-token"

SERVERS: tuple[Server, ...] = (
    # --- TypeScript SDK 0.x: the first reference servers (2024) -------------------------------------------
    Server(
        name="aws-kb",
        package="@modelcontextprotocol/server-aws-kb-retrieval",
        version="0.6.2",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 0.5.0",
        generation=TS_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-aws-kb-retrieval/dist/index.js"),
        env={"AWS_ACCESS_KEY_ID": "AKIADUMMYDUMMYDUMMY", "AWS_SECRET_ACCESS_KEY": "dummy", "AWS_REGION": "us-east-1"},
        call=Call("retrieve_from_aws_kb", {"query": "q", "knowledgeBaseId": "kb"}, "ok", "Retrieval failed"),
        tools=1,
    ),
    Server(
        name="everart",
        package="@modelcontextprotocol/server-everart",
        version="0.6.2",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 0.5.0",
        generation=TS_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-everart/dist/index.js"),
        env={"EVERART_API_KEY": "dummy-everart-key"},
        call=Call("generate_image", {"prompt": "a square"}, "tool_error", "ENOTFOUND"),
        tools=1,
        resources=1,
        note="declares resources, answers resources/templates/list with -32601",
        degraded=("resourceTemplates",),
    ),
    Server(
        name="youtube",
        package="@kimtaeyoon83/mcp-server-youtube-transcript",
        version="0.1.1",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 0.6.0",
        generation=TS_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@kimtaeyoon83/mcp-server-youtube-transcript/dist/index.js"),
        call=Call("get_transcript", {"url": "dQw4w9WgXcQ", "lang": "en"}, "server_error", NET_FAILED, -32603),
        tools=1,
    ),
    # --- TypeScript SDK 1.0.1: the reference servers of late 2024 and early 2025 ---------------------------------
    Server(
        name="brave",
        package="@modelcontextprotocol/server-brave-search",
        version="0.6.2",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-brave-search/dist/index.js"),
        env={"BRAVE_API_KEY": "dummy-brave-key"},
        # its own rate limit (one search a second) answers the second and third client: "Error: Rate limit exceeded"
        call=Call("brave_web_search", {"query": "mcp"}, "tool_error", "Error: "),
        tools=2,
    ),
    Server(
        name="gmaps",
        package="@modelcontextprotocol/server-google-maps",
        version="0.6.2",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-google-maps/dist/index.js"),
        env={"GOOGLE_MAPS_API_KEY": "dummy-maps-key"},
        call=Call("maps_geocode", {"address": "Paris"}, "tool_error", "ENOTFOUND"),
        tools=7,
    ),
    Server(
        name="postgres",
        package="@modelcontextprotocol/server-postgres",
        version="0.6.2",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-postgres/dist/index.js", "postgresql://corpus:dummy@127.0.0.1:1/db"),
        call=Call("query", {"sql": "SELECT 1"}, "server_error", "ECONNREFUSED", -32603),
        tools=1,
        note="declares resources; resources/list fails (no database: -32603), resources/templates/list is -32601",
        degraded=("resources", "resourceTemplates"),
    ),
    Server(
        name="github",
        package="@modelcontextprotocol/server-github",
        version="2025.4.8",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-github/dist/index.js"),
        env={"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_dummydummydummydummydummydummydummy"},
        call=Call("search_repositories", {"query": "mcp"}, "server_error", NET_FAILED, -32603),
        tools=26,
    ),
    Server(
        name="gitlab",
        package="@modelcontextprotocol/server-gitlab",
        version="2025.4.25",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-gitlab/dist/index.js"),
        env={"GITLAB_PERSONAL_ACCESS_TOKEN": "glpat-dummy"},
        call=Call("search_repositories", {"search": "mcp"}, "server_error", "ENOTFOUND", -32603),
        tools=9,
    ),
    Server(
        name="slack",
        package="@modelcontextprotocol/server-slack",
        version="2025.4.25",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-slack/dist/index.js"),
        env={"SLACK_BOT_TOKEN": "xoxb-dummy", "SLACK_TEAM_ID": "T00000000"},
        call=Call("slack_list_channels", {}, "ok", NET_FAILED),
        tools=8,
    ),
    Server(
        name="puppeteer",
        package="@modelcontextprotocol/server-puppeteer",
        version="2025.5.12",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-puppeteer/dist/index.js"),
        call=Call("puppeteer_navigate", {"url": "about:blank"}, "server_error", "Could not find Chrome", -32603),
        tools=7,
        resources=1,
        note="installed without its browser; declares resources, answers resources/templates/list with -32601",
        degraded=("resourceTemplates",),
    ),
    Server(
        name="gdrive",
        package="@modelcontextprotocol/server-gdrive",
        version="2025.1.14",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-gdrive/dist/index.js"),
        env={"GDRIVE_CREDENTIALS_PATH": "{work}/gdrive-credentials.json"},
        call=Call("search", {"query": "notes"}, "server_error", "ENOTFOUND", -32603),
        tools=1,
        note="declares resources; resources/list fails (no network: -32603), resources/templates/list is -32601",
        degraded=("resources", "resourceTemplates"),
    ),
    Server(
        name="everything-2025",
        package="@modelcontextprotocol/server-everything",
        version="2025.1.14",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.0.1",
        generation=TS_1_0,
        protocol=HANDSHAKE_2024,
        transport="sse",
        launch=node_loopback("everything-2025/dist/sse.js"),
        env={"PORT": "{port}"},
        path="/sse",
        call=Call("getTinyImage", {}, "ok", "MCP tiny image"),
        tools=6,
        prompts=2,
        resources=100,
        templates=1,
        one_client=True,
        note="legacy HTTP+SSE, one client at a time (it exits when its client leaves); 100 resources over 10 pages",
    ),
    # --- TypeScript SDK 1.x, current -------------------------------------------------------------------------
    Server(
        name="redis",
        package="@modelcontextprotocol/server-redis",
        version="2025.4.25",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-redis/dist/index.js", "{redis}"),
        call=Call("list", {}, "ok", "No keys found"),
        tools=4,
        needs=("redis",),
    ),
    Server(
        name="everything",
        package="@modelcontextprotocol/server-everything",
        version="2026.8.31",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="http",
        launch=node_loopback("@modelcontextprotocol/server-everything/dist/index.js", "streamableHttp"),
        env={"PORT": "{port}"},
        call=Call("get-tiny-image", {}, "ok"),
        tools=16,
        prompts=4,
        resources=7,
        templates=2,
        note="16 tools to a client that declares sampling and elicitation (13 with neither)",
    ),
    Server(
        name="seqthink",
        package="@modelcontextprotocol/server-sequential-thinking",
        version="2026.8.31",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-sequential-thinking/dist/index.js"),
        env={"DISABLE_THOUGHT_LOGGING": "true"},
        call=Call(
            "sequentialthinking",
            {"thought": "one", "nextThoughtNeeded": False, "thoughtNumber": 1, "totalThoughts": 1},
            "ok",
            "thoughtHistoryLength",
        ),
        tools=1,
    ),
    Server(
        name="filesystem",
        package="@modelcontextprotocol/server-filesystem",
        version="2026.8.31",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-filesystem/dist/index.js", "{work}/files"),
        call=Call("list_allowed_directories", {}, "ok", "Allowed directories"),
        tools=14,
    ),
    Server(
        name="memory",
        package="@modelcontextprotocol/server-memory",
        version="2026.8.31",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("@modelcontextprotocol/server-memory/dist/index.js"),
        env={"MEMORY_FILE_PATH": "{work}/memory.jsonl"},
        call=Call("read_graph", {}, "ok", "entities"),
        tools=9,
        resources=1,
    ),
    Server(
        name="notion",
        package="@notionhq/notion-mcp-server",
        version="2.5.2",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="http",
        launch=node(
            "@notionhq/notion-mcp-server/bin/cli.mjs",
            "--transport",
            "http",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--auth-token",
            NOTION_BEARER,
        ),
        env={"NOTION_TOKEN": "ntn_dummy"},
        headers={"Authorization": f"Bearer {NOTION_BEARER}"},
        call=Call("API-get-self", {}, "server_error", "ENOTFOUND", -32603),
        tools=24,
        note="streamable HTTP behind its own bearer check",
    ),
    Server(
        name="sentry",
        package="@sentry/mcp-server",
        version="0.39.0",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.30.0",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("@sentry/mcp-server/dist/index.js", "--access-token=sntrys_dummy"),
        env={"SENTRY_DSN": "", "DO_NOT_TRACK": "1"},
        call=Call("find_organizations", {}, "tool_error", "Unable to connect"),
        tools=9,
    ),
    Server(
        name="stripe",
        package="@stripe/mcp",
        version="0.2.5",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("@stripe/mcp/dist/index.js", "--tools=all", "--api-key=sk_test_dummy"),
        call=Call("list_customers", {}, "ok", "Failed to list customers"),
        tools=22,
    ),
    Server(
        name="kubernetes",
        package="mcp-server-kubernetes",
        version="4.1.7",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.26.0",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("mcp-server-kubernetes/dist/index.js"),
        env={"KUBECONFIG": "{work}/kubeconfig"},
        call=Call("ping", {}, "ok"),
        tools=23,
        prompts=1,
        resources=5,
        note="declares resources, answers resources/templates/list with -32601",
        degraded=("resourceTemplates",),
    ),
    Server(
        name="playwright",
        package="@playwright/mcp",
        version="0.0.83",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.x (bundled in playwright-core)",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="sse",
        launch=node(
            "@playwright/mcp/cli.js",
            "--headless",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--allowed-hosts",
            "127.0.0.1:{port}",
        ),
        path="/sse",
        call=Call("browser_close", {}, "tool_error", "is not found"),
        tools=25,
        note="installed without a browser; the legacy SSE endpoint of its HTTP mode",
    ),
    Server(
        name="tavily",
        package="tavily-mcp",
        version="0.2.22",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.26.0",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("tavily-mcp/build/index.js"),
        env={"TAVILY_API_KEY": "tvly-dummy"},
        call=Call("tavily_search", {"query": "mcp"}, "tool_error", "ENOTFOUND"),
        tools=5,
    ),
    Server(
        name="figma",
        package="figma-developer-mcp",
        version="0.13.2",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.29.0",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="http",
        launch=node(
            "figma-developer-mcp/dist/bin.js",
            "--figma-api-key=dummy-figma-key",
            "--no-telemetry",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ),
        call=Call("get_figma_data", {"fileKey": "corpus"}, "tool_error", NET_FAILED),
        tools=2,
        note="stateless streamable HTTP (no session id)",
    ),
    Server(
        name="circleci",
        package="@circleci/mcp-server-circleci",
        version="0.20.0",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.32.2",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("@circleci/mcp-server-circleci/dist/index.js"),
        env={"CIRCLECI_TOKEN": "dummy-circleci-token"},
        call=Call("list_followed_projects", {}, "tool_error", NET_FAILED),
        tools=13,
    ),
    Server(
        name="exa",
        package="exa-mcp-server",
        version="3.4.1",
        registry="npm",
        sdk="@modelcontextprotocol/sdk 1.26.0",
        generation=TS_1_X,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=node("exa-mcp-server/dist/stdio.cjs"),
        env={"EXA_API_KEY": "dummy-exa-key"},
        call=Call("web_search_exa", {"query": "mcp"}, "tool_error", NET_FAILED),
        tools=2,
        prompts=1,
        resources=1,
    ),
    # --- TypeScript SDK 2.x -----------------------------------------------------------------------------------
    Server(
        name="supabase",
        package="@supabase/mcp-server-supabase",
        version="0.13.0",
        registry="npm",
        sdk="@modelcontextprotocol/server 2.4.0",
        generation=TS_2,
        protocol=MODERN,
        transport="stdio",
        launch=node(
            "@supabase/mcp-server-supabase/dist/cli.js", "--access-token=sbp_dummy", "--features=account,database"
        ),
        call=Call("list_projects", {}, "tool_error", NET_FAILED),
        tools=14,
        note="without --features its tools/list needs the network (docs feature)",
    ),
    Server(
        name="mongodb",
        package="mongodb-mcp-server",
        version="3.0.4",
        registry="npm",
        sdk="@modelcontextprotocol/server 2.4.0",
        generation=TS_2,
        protocol=MODERN,
        transport="stdio",
        launch=node("mongodb-mcp-server/dist/esm/index.js"),
        env={"MDB_MCP_TELEMETRY": "disabled"},
        call=Call("list-connections", {}, "ok"),
        tools=27,
        resources=2,
        templates=1,
    ),
    Server(
        name="context7",
        package="@upstash/context7-mcp",
        version="4.1.1",
        registry="npm",
        sdk="@modelcontextprotocol/server 2.0.0",
        generation=TS_2,
        protocol=MODERN,
        transport="http",
        launch=node_loopback("@upstash/context7-mcp/dist/index.js", "--transport", "http", "--port", "{port}"),
        call=Call("resolve-library-id", {"libraryName": "react", "query": "hooks"}, "ok", NET_FAILED),
        tools=2,
    ),
    # --- Python mcp 1.x (its own venv, mcp<2) ------------------------------------------------------------------
    Server(
        name="sqlite",
        package="mcp-server-sqlite",
        version="2025.4.25",
        registry="PyPI",
        sdk="mcp 1.30.0",
        generation=PY_1,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=("{mcp1}/mcp-server-sqlite", "--db-path", "{work}/corpus.sqlite"),
        call=Call("list_tables", {}, "ok"),
        tools=6,
        prompts=1,
        resources=1,
        note="declares resources, answers resources/templates/list with -32601",
        degraded=("resourceTemplates",),
    ),
    Server(
        name="fetch-2025",
        package="mcp-server-fetch",
        version="2025.4.7",
        registry="PyPI",
        sdk="mcp 1.30.0",
        generation=PY_1,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=("{mcp1}/mcp-server-fetch",),
        call=Call("fetch", {"url": "http://127.0.0.1:9/"}, "tool_error", "connection issue"),
        tools=1,
        prompts=1,
    ),
    Server(
        name="git-2025",
        package="mcp-server-git",
        version="2025.7.1",
        registry="PyPI",
        sdk="mcp 1.30.0",
        generation=PY_1,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=("{mcp1}/mcp-server-git", "--repository", "{work}/repo"),
        call=Call("git_status", {"repo_path": "{work}/repo"}, "ok", "Repository status"),
        tools=13,
    ),
    Server(
        name="awsdocs-2025",
        package="awslabs.aws-documentation-mcp-server",
        version="1.1.0",
        registry="PyPI",
        sdk="mcp 1.30.0 (its FastMCP)",
        generation=PY_1,
        protocol=HANDSHAKE_2025,
        transport="sse",
        launch=(
            "{mcp1}/python",
            "-c",
            "import sys; from awslabs.aws_documentation_mcp_server.server_aws import mcp; "
            "mcp.settings.host = '127.0.0.1'; mcp.settings.port = int(sys.argv[1]); mcp.run('sse')",
            "{port}",
        ),
        env={"FASTMCP_LOG_LEVEL": "ERROR"},
        path="/sse",
        call=Call(
            "recommend", {"url": "https://docs.aws.amazon.com/index.html"}, "ok", "Error getting recommendations"
        ),
        tools=3,
        note="the server's FastMCP object run with the SDK's SSE transport",
    ),
    # --- FastMCP 3 (on mcp 1.x) ----------------------------------------------------------------------------------
    Server(
        name="atlassian",
        package="mcp-atlassian",
        version="0.23.1",
        registry="PyPI",
        sdk="fastmcp 3.4.11, mcp 1.30.0",
        generation=FASTMCP_3,
        protocol=HANDSHAKE_2025,
        transport="sse",
        launch=("{fastmcp}/mcp-atlassian", "--transport", "sse", "--host", "127.0.0.1", "--port", "{port}"),
        env=ATLASSIAN_ENV,
        path="/sse",
        call=Call("jira_get_all_projects", {}, "ok"),
        tools=98,
    ),
    Server(
        name="duckduckgo-2025",
        package="duckduckgo-mcp-server",
        version="0.1.1",
        registry="PyPI",
        sdk="mcp 1.30.0 (its FastMCP)",
        generation=PY_1,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=("{fastmcp}/duckduckgo-mcp-server",),
        call=Call("search", {"query": "mcp"}, "ok", "An error occurred while searching"),
        tools=2,
    ),
    Server(
        name="arxiv",
        package="arxiv-mcp-server",
        version="0.8.2",
        registry="PyPI",
        sdk="mcp 1.30.0",
        generation=PY_1,
        protocol=HANDSHAKE_2025,
        transport="stdio",
        launch=("{fastmcp}/arxiv-mcp-server", "--storage-path", "{work}/arxiv"),
        call=Call("list_papers", {}, "ok", "total_papers"),
        tools=19,
        prompts=7,
    ),
    # --- Python mcp 2.x ------------------------------------------------------------------------------------------
    Server(
        name="time",
        package="mcp-server-time",
        version="2026.10.19",
        registry="PyPI",
        sdk="mcp 2.3.0",
        generation=PY_2,
        protocol=MODERN,
        transport="stdio",
        launch=("{project}/mcp-server-time", "--local-timezone", "UTC"),
        call=Call("get_current_time", {"timezone": "UTC"}, "ok", "UTC"),
        tools=2,
        note="installed in the project's own virtualenv",
    ),
    Server(
        name="fetch",
        package="mcp-server-fetch",
        version="2026.10.24",
        registry="PyPI",
        sdk="mcp 2.3.0",
        generation=PY_2,
        protocol=MODERN,
        transport="stdio",
        launch=("{mcp2}/mcp-server-fetch",),
        call=Call("fetch", {"url": "http://127.0.0.1:9/"}, "tool_error", "not a public address"),
        tools=1,
        prompts=1,
    ),
    Server(
        name="git",
        package="mcp-server-git",
        version="2026.10.19",
        registry="PyPI",
        sdk="mcp 2.3.0",
        generation=PY_2,
        protocol=MODERN,
        transport="stdio",
        launch=("{mcp2}/mcp-server-git", "--repository", "{work}/repo"),
        call=Call("git_status", {"repo_path": "{work}/repo"}, "ok", "Repository status"),
        tools=12,
    ),
    Server(
        name="awsdocs",
        package="awslabs.aws-documentation-mcp-server",
        version="1.2.3",
        registry="PyPI",
        sdk="mcp 2.3.0 (MCPServer)",
        generation=PY_2,
        protocol=MODERN,
        transport="stdio",
        launch=("{mcp2}/awslabs.aws-documentation-mcp-server",),
        env={"FASTMCP_LOG_LEVEL": "ERROR"},
        call=Call(
            "recommend", {"url": "https://docs.aws.amazon.com/index.html"}, "ok", "Error getting recommendations"
        ),
        tools=5,
    ),
    Server(
        name="excel",
        package="excel-mcp-server",
        version="2.2.2",
        registry="PyPI",
        sdk="mcp 2.3.0 (MCPServer)",
        generation=PY_2,
        protocol=MODERN,
        transport="http",
        launch=("{mcp2}/excel-mcp-server", "streamable-http", "--host", "127.0.0.1", "--port", "{port}"),
        env={"EXCEL_FILES_PATH": "{work}/files"},
        call=Call("list_workbooks", {}, "ok"),
        tools=46,
    ),
    Server(
        name="duckduckgo",
        package="duckduckgo-mcp-server",
        version="0.7.0",
        registry="PyPI",
        sdk="mcp 2.3.0 (MCPServer)",
        generation=PY_2,
        protocol=MODERN,
        transport="sse",
        launch=("{mcp2}/duckduckgo-mcp-server", "--transport", "sse", "--host", "127.0.0.1", "--port", "{port}"),
        path="/sse",
        call=Call("search", {"query": "mcp"}, "ok", "No results were found"),
        tools=3,
    ),
    # --- FastMCP 4 (on mcp 2.x) ----------------------------------------------------------------------------------
    Server(
        name="motherduck",
        package="mcp-server-motherduck",
        version="1.1.0",
        registry="PyPI",
        sdk="fastmcp 4.2.3, mcp 2.3.0",
        generation=FASTMCP_4,
        protocol=MODERN,
        transport="http",
        launch=(
            "{mcp2}/mcp-server-motherduck",
            "--transport",
            "http",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--db-path",
            ":memory:",
            "--read-write",
        ),
        call=Call("execute_query", {"sql": "SELECT 42 AS answer"}, "ok", "42"),
        tools=4,
    ),
)

BY_NAME = {s.name: s for s in SERVERS}

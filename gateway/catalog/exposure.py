"""Deferred exposure: instead of every tool, a caller lists a search tool and a call tool (plus the tools marked
`always`), finds what it needs with the search, and calls it by name.

`Finder` keeps the offline search index in step with the catalog (incrementally, yielding to the event loop
on big changes); the search only ever ranks tools of the caller's view.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import anyio

from gateway.catalog.merged import Catalog, Entry
from gateway.catalog.search import ToolIndex

if TYPE_CHECKING:
    from gateway.catalog.embedding import Embedding

Json = dict[str, Any]
Exposure = Literal["direct", "deferred"]
SEARCH_TOOL = "manifold__search_tools"
CALL_TOOL = "manifold__call_tool"
OWN_TOOLS = frozenset({SEARCH_TOOL, CALL_TOOL})
DEFAULT_LIMIT = 5
MAX_LIMIT = 50
MAX_QUERY = 1000
SYNC_SLICE = 256  # index updates between two yields to the event loop
MODEL_SYNC_SLICE = 4  # with an embedding model, which embeds each tool it puts (a transformer takes ~15 ms a tool)

SEARCH_DEFINITION: Json = {
    "name": SEARCH_TOOL,
    "title": "Search tools",
    "description": (
        "Find the tools that can do a task. This gateway serves many tools but lists only a few; search first, "
        "then call a tool you found with manifold__call_tool (or by its name, if your client lists it after the "
        "search). Describe the need in plain words, as you would to a colleague, e.g. 'open issues that mention "
        "login' or 'take a screenshot of the page'. Results are ranked best first, each with its name, "
        "description and input schema. Give `server` to search one server's tools only. If nothing fits, "
        "rephrase with other words before giving up."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What you need to do, in natural language."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "default": DEFAULT_LIMIT,
                "description": "How many tools to return (default 5).",
            },
            "server": {"type": "string", "description": "Only tools of this server (the part before `__`)."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    "outputSchema": {
        "type": "object",
        "properties": {
            "tools": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "description": {"type": "string"},
                        "inputSchema": {"type": "object"},
                    },
                    "required": ["name", "inputSchema"],
                },
            }
        },
        "required": ["tools"],
    },
    "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
}

CALL_DEFINITION: Json = {
    "name": CALL_TOOL,
    "title": "Call a tool",
    "description": (
        "Call a tool found with manifold__search_tools: give its exact `name` and its `arguments` as an object "
        "that matches the tool's input schema. The answer is the tool's own."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The tool's name, as the search returned it."},
            "arguments": {"type": "object", "description": "The tool's arguments.", "default": {}},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
}


class BadInput(ValueError):
    """Arguments of one of the gateway's own tools that cannot be used; the message says why."""


def search_request(arguments: Any) -> tuple[str, int, str | None]:
    """`(query, limit, server)` from the search tool's arguments; `BadInput` names what is wrong."""
    if not isinstance(arguments, dict):
        raise BadInput("arguments must be an object with a `query`")
    unknown = set(arguments) - {"query", "limit", "server"}
    if unknown:
        raise BadInput(f"unknown argument(s) {sorted(unknown)}; use query, limit, server")
    query, limit, server = arguments.get("query"), arguments.get("limit", DEFAULT_LIMIT), arguments.get("server")
    if not isinstance(query, str) or not query.strip():
        raise BadInput("`query` must be a non-empty string saying what you need")
    if len(query) > MAX_QUERY:
        raise BadInput(f"`query` is over {MAX_QUERY} characters; say the need in fewer words")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"`limit` must be an integer from 1 to {MAX_LIMIT}")
    if server is not None and not isinstance(server, str):
        raise BadInput("`server` must be a string")
    return query, limit, server


def call_request(arguments: Any) -> tuple[str, Json]:
    """`(name, arguments)` from the call tool's arguments; `BadInput` names what is wrong."""
    if not isinstance(arguments, dict):
        raise BadInput("arguments must be an object with the tool's `name` and its `arguments`")
    unknown = set(arguments) - {"name", "arguments"}
    if unknown:
        raise BadInput(f"unknown argument(s) {sorted(unknown)}; use name and arguments")
    name, inner = arguments.get("name"), arguments.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise BadInput("`name` must be the name of a tool, as manifold__search_tools returned it")
    if name in OWN_TOOLS:
        raise BadInput(f"{name} is called directly, not through {CALL_TOOL}")
    if inner is None:
        inner = {}
    if not isinstance(inner, dict):
        raise BadInput("`arguments` must be an object")
    return name, inner


def found_result(entries: list[Entry], query: str) -> Json:
    """The search tool's answer: readable text, and the same as `structuredContent`."""
    tools = [
        {"name": e.public, "description": str(e.tool.get("description") or ""), "inputSchema": e.input_schema or {}}
        for e in entries
    ]
    if not tools:
        text = f"No tool matches {query!r}. Try other words, or a broader need."
    else:
        parts = [f"{len(tools)} tool(s) for {query!r}, best first. Call one with {CALL_TOOL}."]
        for n, tool in enumerate(tools, 1):
            schema = json.dumps(tool["inputSchema"], separators=(",", ":"), ensure_ascii=False)
            parts.append(f"{n}. {tool['name']}: {tool['description']}\n   input schema: {schema}")
        text = "\n".join(parts)
    return {"content": [{"type": "text", "text": text}], "structuredContent": {"tools": tools}, "isError": False}


def bad_input_result(tool: str, problem: str) -> Json:
    """A tool error for bad arguments to one of the gateway's own tools."""
    return {"content": [{"type": "text", "text": f"{tool}: {problem}"}], "isError": True}


class Finder:
    """The search index over the catalog's served tools, kept in step with it."""

    def __init__(self, catalog: Catalog, model: Embedding | None = None) -> None:
        """`model`: the embedding model fused with the lexical index (the `search_model` setting's; None: lexical)."""
        self.catalog = catalog
        self.index = ToolIndex(model=model)
        self._slice = SYNC_SLICE if model is None else MODEL_SYNC_SLICE
        self._indexed: dict[str, Json] = {}
        self._version = -1  # the catalog's version the index is in step with
        self._lock = anyio.Lock()

    async def sync(self) -> None:
        """Bring the index in step with the catalog: add, replace and remove only what changed."""
        async with self._lock:
            touched = self.catalog.changed_since(self._version)
            self._version = self.catalog.version
            if touched is not None:  # only the names the changes moved
                for n, name in enumerate(touched, 1):
                    entry = self.catalog.resolve(name)
                    if entry is None and self._indexed.pop(name, None) is not None:
                        self.index.remove(name)
                    elif entry is not None and self._indexed.get(name) != entry.tool:
                        self.index.put(name, entry.server, entry.tool)
                        self._indexed[name] = entry.tool
                    if n % self._slice == 0:
                        await anyio.sleep(0)
                return
            entries = self.catalog.entries
            work = 0
            for name in [n for n in self._indexed if n not in entries]:
                self.index.remove(name)
                del self._indexed[name]
                work += 1
                if work % self._slice == 0:
                    await anyio.sleep(0)
            for name, entry in list(entries.items()):
                if self._indexed.get(name) is entry.tool or self._indexed.get(name) == entry.tool:
                    continue
                self.index.put(name, entry.server, entry.tool)
                self._indexed[name] = entry.tool
                work += 1
                if work % self._slice == 0:
                    await anyio.sleep(0)

    def search(self, query: str, limit: int, allows: Callable[[Entry], bool], server: str | None) -> list[Entry]:
        """The best tools for `query` among those `allows` (and of `server`, when given), best first."""
        entries = self.catalog.entries

        def accept(name: str) -> bool:
            entry = entries.get(name)
            return entry is not None and (server is None or entry.server == server) and allows(entry)

        return [entries[hit.name] for hit in self.index.search(query, limit, accept) if hit.name in entries]

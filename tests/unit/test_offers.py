"""Listings a server fails to give degrade it; they never put it down (a real SDK session, a scripted far end)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.message import SessionMessage
from mcp.types import jsonrpc_message_adapter

from gateway.config.servers import ServerSpec
from gateway.upstream.offers import list_offers

pytestmark = pytest.mark.anyio
Json = dict[str, Any]
TOOL: Json = {"name": "echo", "inputSchema": {"type": "object"}}
PROMPT: Json = {"name": "greet"}
NOT_FOUND: Json = {"code": -32601, "message": "Method not found"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class OldServer:
    """A 2024-11-05 server that declares tools, prompts and resources; `answers` maps a method to its result,
    or to an error (a dict with `code`)."""

    def __init__(self, answers: dict[str, Json]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.to_server, self.server_reads = anyio.create_memory_object_stream[SessionMessage](8)
        self.server_writes, self.from_server = anyio.create_memory_object_stream[SessionMessage | Exception](8)

    async def serve(self) -> None:
        async for message in self.server_reads:
            await self.answer(message.message.model_dump(by_alias=True, exclude_none=True))

    async def answer(self, wire: Json) -> None:
        """Answer one message from the client (notifications are taken silently)."""
        method, request_id = wire.get("method"), wire.get("id")
        if request_id is None:
            return
        self.asked.append(str(method))
        if method == "initialize":
            answer: Json = {
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {}, "prompts": {}, "resources": {}},
                "serverInfo": {"name": "old", "version": "0.1"},
            }
        else:
            answer = self.answers.get(str(method), NOT_FOUND)
        kind = "error" if "code" in answer else "result"
        reply = jsonrpc_message_adapter.validate_python({"jsonrpc": "2.0", "id": request_id, kind: answer})
        await self.server_writes.send(SessionMessage(reply))


@asynccontextmanager
async def session_with(server: OldServer) -> AsyncIterator[ClientSession]:
    async with anyio.create_task_group() as tg, ClientSession(server.from_server, server.to_server) as session:
        tg.start_soon(server.serve)
        await session.initialize()
        yield session
        tg.cancel_scope.cancel()


SPEC = ServerSpec.model_validate({"name": "old", "command": "old-server"})


async def test_listings_answered_method_not_found_are_empty_and_named_while_the_tools_serve() -> None:
    server = OldServer({"tools/list": {"tools": [TOOL]}, "resources/list": {"resources": []}})
    async with session_with(server) as session:
        offers = await list_offers(session, SPEC)
    assert [t["name"] for t in offers.tools] == ["echo"]
    assert offers.prompts == () and offers.templates == ()
    assert dict(offers.degraded) == {"prompts": "Method not found", "resourceTemplates": "Method not found"}
    assert "resources/templates/list" in server.asked


async def test_a_listing_that_fails_on_a_refresh_keeps_what_it_held_and_one_that_recovers_is_no_longer_named() -> None:
    server = OldServer({"tools/list": {"tools": [TOOL]}, "prompts/list": {"prompts": [PROMPT]}})
    async with session_with(server) as session:
        first = await list_offers(session, SPEC)
        assert first.prompts == (PROMPT,) and "prompts" not in dict(first.degraded)
        server.answers["prompts/list"] = {"code": -32603, "message": "database is locked"}
        second = await list_offers(session, SPEC, previous=first)
        assert second.prompts == (PROMPT,) and dict(second.degraded)["prompts"] == "database is locked"
        server.answers["prompts/list"] = {"prompts": []}
        third = await list_offers(session, SPEC, previous=second)
    assert third.prompts == () and "prompts" not in dict(third.degraded)


async def test_a_page_that_is_not_a_listing_degrades_that_listing_only() -> None:
    server = OldServer({"tools/list": {"tools": [TOOL]}, "prompts/list": {"prompts": "not a list"}})
    async with session_with(server) as session:
        offers = await list_offers(session, SPEC)
    assert [t["name"] for t in offers.tools] == ["echo"]
    assert dict(offers.degraded)["prompts"] == "prompts/list answered with something that is not a listing"


async def test_a_tool_listing_that_fails_leaves_the_server_up_with_no_tools() -> None:
    server = OldServer({"prompts/list": {"prompts": [PROMPT]}})
    async with session_with(server) as session:
        offers = await list_offers(session, SPEC)
    assert offers.tools == () and offers.prompts == (PROMPT,)
    assert dict(offers.degraded)["tools"] == "Method not found"

"""The task methods on the SDK's server (`tasks/get|result|cancel|update|list`), checked for the caller's era and
sent to the task's server (`gateway.core.tasks`)."""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext

from gateway.core.registry import Registry
from gateway.core.tasks import Tasks
from gateway.downstream.gate import HANDED_KEY, TASKS_ELSEWHERE_KEY
from gateway.downstream.handshake import TASKS_EXTENSION
from gateway.downstream.inflight import InFlight
from gateway.downstream.requests import call_context, caller_of, page, task_owner
from gateway.downstream.sessions import Sessions
from gateway.protocol.era import Era
from gateway.relay.callers import declared_capabilities

Ctx = ServerRequestContext[Any]


class TaskHandlers:
    """The SDK server's handlers for the task methods, on the tasks `tasks` handed out."""

    def __init__(self, registry: Registry, sessions: Sessions, inflight: InFlight, tasks: Tasks) -> None:
        self.registry = registry
        self.sessions = sessions
        self.inflight = inflight
        self.tasks = tasks

    async def get(self, ctx: Ctx, params: Any) -> Any:
        """`tasks/get`."""
        return await self._task(ctx, "tasks/get")

    async def update(self, ctx: Ctx, params: Any) -> Any:
        """`tasks/update` (2026 tasks extension)."""
        if not Era.of(ctx.protocol_version).has("tasks/update"):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "tasks/update")
        return await self._task(ctx, "tasks/update")

    async def result(self, ctx: Ctx, params: Any) -> Any:
        """`tasks/result` (2025-11-25; 2026 inlines it in `tasks/get`)."""
        if not Era.of(ctx.protocol_version).has("tasks/result"):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "tasks/result")
        with self.inflight.tracking():
            return await self._task(ctx, "tasks/result")

    async def cancel(self, ctx: Ctx, params: Any) -> Any:
        """`tasks/cancel`."""
        return await self._task(ctx, "tasks/cancel")

    async def listing(self, ctx: Ctx, params: types.PaginatedRequestParams) -> Any:
        """`tasks/list` (2025-11-25)."""
        if not Era.of(ctx.protocol_version).has("tasks/list"):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "tasks/list")
        listing = await self.tasks.listing(self.registry, task_owner(ctx), call_context(ctx, None))
        tasks: list[Any] = listing["tasks"]
        state = ctx.request.state if ctx.request is not None else None
        if getattr(state, HANDED_KEY, False):  # for the replica that asked: this one's tasks, whole
            return Era.of(ctx.protocol_version).with_result_type({"tasks": tasks})
        if (elsewhere := getattr(state, TASKS_ELSEWHERE_KEY, None)) is not None:
            tasks = sorted([*tasks, *await elsewhere()], key=lambda t: (str(t.get("createdAt")), str(t["taskId"])))
        return page(tasks, params.cursor, "tasks", ctx.protocol_version)

    async def _task(self, ctx: Ctx, method: str) -> Any:
        params = ctx.params if isinstance(ctx.params, dict) else {}
        if Era.of(ctx.protocol_version).modern:
            if TASKS_EXTENSION not in (declared_capabilities(ctx).get("extensions") or {}):
                raise MCPError(
                    types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                    f"{method} needs the {TASKS_EXTENSION} extension, which this request does not declare",
                    {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
                )
            named = ctx.request.headers.get("mcp-name") if ctx.request is not None else None
            if ctx.request is not None and named != params.get("taskId"):
                raise MCPError(types.HEADER_MISMATCH, f"the Mcp-Name header does not match {method}'s taskId")
        call = call_context(ctx, caller_of(ctx, self.sessions))
        return await self.tasks.request(
            self.registry, method, params, task_owner(ctx), call, draining=self.inflight.draining
        )

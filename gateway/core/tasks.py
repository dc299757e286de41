"""Tasks: the 2025-11-25 task-augmented calls (`tools/call` with a `task`, then `tasks/get|result|cancel|list`)
and the 2026 tasks extension (`io.modelcontextprotocol/tasks`: the server answers `resultType: "task"`,
then `tasks/get|update|cancel`).

A server's task id is never shown as is: the caller gets an id of the gateway's, bound to the server
that runs the task and to its owner (a 2025-era caller's session; for sessionless 2026 callers, the
token), so ids of two servers never meet and one client cannot read, answer or cancel another's
task. Requests about a task go to its server under the server's own id, with the rest of their
parameters unchanged, and every task in an answer is shown under the caller's id. The gateway's id begins with
the `origin` of the process that handed it out, so a request about it that reaches another replica is handed
over to this one (see `downstream.replicas`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp import MCPError

from gateway.core.calls import Draining
from gateway.core.forward import forward
from gateway.relay.context import CallContext

if TYPE_CHECKING:
    from gateway.core.registry import Registry

Json = dict[str, Any]
MAX_TASKS = 10_000
PREFIX = "manifold-"


@dataclass(frozen=True, slots=True)
class TaskRef:
    """Where a task the gateway handed out runs, and whose it is."""

    server: str
    upstream_id: str
    owner: str


class Tasks:
    """The tasks handed out to callers, by the gateway's id."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self._refs: dict[str, TaskRef] = {}
        self._by_upstream: dict[tuple[str, str], str] = {}

    def publish(self, result: Json, server: str, owner: str) -> Json:
        """A server's answer with its task (`task`, or a task's own fields at the top) under our id."""
        task = result.get("task")
        if isinstance(task, dict) and isinstance(task.get("taskId"), str):
            return {**result, "task": {**task, "taskId": self._public(server, task["taskId"], owner)}}
        if isinstance(result.get("taskId"), str):
            return {**result, "taskId": self._public(server, result["taskId"], owner)}
        return result

    def _public(self, server: str, upstream_id: str, owner: str) -> str:
        known = self._by_upstream.get((server, upstream_id))
        if known is not None:
            return known
        if len(self._refs) >= MAX_TASKS:
            oldest = next(iter(self._refs))
            ref = self._refs.pop(oldest)
            self._by_upstream.pop((ref.server, ref.upstream_id), None)
        public = f"{PREFIX}{self.origin}-{secrets.token_hex(12)}"
        self._refs[public] = TaskRef(server, upstream_id, owner)
        self._by_upstream[(server, upstream_id)] = public
        return public

    @staticmethod
    def origin_of(public: str) -> str | None:
        """The origin of the process that handed out a gateway's task id."""
        if not public.startswith(PREFIX):
            return None
        origin, dash, _ = public[len(PREFIX) :].partition("-")
        return origin if dash else None

    def resolve(self, public: str, owner: str) -> TaskRef:
        """The task a caller names; another caller's task is as unknown as one that never existed."""
        ref = self._refs.get(public)
        if ref is None or ref.owner != owner:
            raise MCPError(types.INVALID_PARAMS, f"Unknown task: {public[:128]}")
        return ref

    def owned(self, owner: str) -> list[tuple[str, TaskRef]]:
        """The caller's tasks, oldest first."""
        return [(public, ref) for public, ref in self._refs.items() if ref.owner == owner]

    async def request(
        self,
        registry: Registry,
        method: str,
        params: Json,
        owner: str,
        call: CallContext,
        *,
        draining: bool,
    ) -> Json:
        """A request about one task (`tasks/get`, `tasks/result`, `tasks/update`, `tasks/cancel`), sent to its
        server under the server's id with its other parameters unchanged."""
        public = params.get("taskId")
        if not isinstance(public, str):
            raise MCPError(types.INVALID_PARAMS, f"{method} needs a `taskId`")
        ref = self.resolve(public, owner)
        if draining:
            raise Draining()
        forwarded = {**{k: v for k, v in params.items() if k != "_meta"}, "taskId": ref.upstream_id}
        result = await forward(registry, call, ref.server, method, forwarded)
        if method == "tasks/result":
            return result
        return self.publish(result, ref.server, owner)

    async def listing(self, registry: Registry, owner: str, call: CallContext) -> Json:
        """`tasks/list`: the caller's tasks, each as its server reports it now (one its server forgot is left out)."""
        tasks = []
        quiet = replace(call, caller=None, progress=None)
        for public, ref in self.owned(owner):
            try:
                state = await forward(registry, quiet, ref.server, "tasks/get", {"taskId": ref.upstream_id})
            except MCPError:
                continue
            task = {k: v for k, v in state.items() if k not in ("_meta", "resultType")}
            tasks.append({**task, "taskId": public})
        return {"tasks": tasks}

"""Rounds of questions inside one call: a 2026-era server's `input_required` answers put to a 2025-era caller,
and the gateway's own confirmation of a gated call.

A 2025-era caller cannot take an `input_required` result: each question is asked on its call's stream
and the request is sent again with the answers and the server's state, until the server completes. A
gated call asks the human first: a 2025-era caller with an `elicitation/create` request, a 2026-era
caller with an `input_required` result whose `requestState` seals the tool and its arguments.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext

from gateway.catalog.merged import Entry
from gateway.protocol.era import Era
from gateway.relay.asks import Caller, Callers

Json = dict[str, Any]
MAX_INPUT_ROUNDS = 16
CONFIRM_KEY = "manifold/confirm"
CONFIRM_SCHEMA: Json = {
    "type": "object",
    "properties": {"allow": {"type": "boolean", "title": "Allow this call?"}},
    "required": ["allow"],
}


async def answer_rounds(
    raw: Json, caller: Caller, callers: Callers, send_again: Callable[[Json], Awaitable[Json]], server: str
) -> Json:
    """A server's answer for a 2025-era `caller`: while it is `input_required`, ask the caller each request on
    its stream and `send_again` the request with the answers (`inputResponses`, `requestState`)."""
    for _ in range(MAX_INPUT_ROUNDS):
        if raw.get("resultType") != "input_required":
            return raw
        requests = raw.get("inputRequests")
        answers: Json = {}
        for key, request in (requests if isinstance(requests, dict) else {}).items():
            method = request.get("method") if isinstance(request, dict) else None
            params = request.get("params") if isinstance(request, dict) else None
            answers[key] = await callers.ask_of(caller, str(method), params if isinstance(params, dict) else {})
        rounds: Json = {"inputResponses": answers}
        if "requestState" in raw:
            rounds["requestState"] = raw["requestState"]
        raw = await send_again(rounds)
    raise MCPError(
        types.INTERNAL_ERROR, f"server '{server}' asked for input more than {MAX_INPUT_ROUNDS} times in a row"
    )


def confirm_state(key: bytes, entry: Entry, arguments: Mapping[str, Any] | None) -> str:
    """The `requestState` of a confirmation: an HMAC under `key` of the tool and its arguments."""
    text = json.dumps([entry.public, arguments or {}], sort_keys=True, default=str)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


async def confirm(
    ctx: ServerRequestContext[Any], entry: Entry, params: types.CallToolRequestParams, key: bytes
) -> Json | str | None:
    """Ask the human to allow a gated call: None when allowed, the `input_required` result to answer a 2026-era
    caller with, or why the call is not made."""
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return (
            "this tool needs the user's confirmation, but this client cannot ask (it did not declare the "
            "elicitation capability); the call was not made"
        )
    arguments = json.dumps(params.arguments or {}, indent=2, default=str)
    message = f"Allow {entry.public} (server '{entry.server}') with these arguments?\n{arguments[:4000]}"
    if Era.of(ctx.protocol_version).modern:
        state = confirm_state(key, entry, params.arguments)
        answer = (params.input_responses or {}).get(CONFIRM_KEY)
        if answer is None or not hmac.compare_digest(params.request_state or "", state):
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(message=message, requested_schema=CONFIRM_SCHEMA)
            )
            pending = types.InputRequiredResult(input_requests={CONFIRM_KEY: request}, request_state=state)
            return pending.model_dump(by_alias=True, mode="json", exclude_none=True)
        result = answer if isinstance(answer, types.ElicitResult) else types.ElicitResult.model_validate(answer)
    else:
        result = await ctx.session.elicit_form(message, CONFIRM_SCHEMA, related_request_id=ctx.request_id)
    if result.action == "accept" and (result.content or {}).get("allow") is True:
        return None
    return "the user did not allow this call; it was not made"

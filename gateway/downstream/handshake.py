"""What the gateway declares of itself: the capabilities some server behind it offers (narrowed to the caller's
view), in the SDK's handshakes and in those the gateway answers itself (a dormant session's `initialize`)."""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server import NotificationOptions, Server
from mcp.server.context import HandlerResult
from mcp.server.models import InitializationOptions
from mcp.types.methods import serialize_server_result
from pydantic import ValidationError

from gateway.core.registry import Registry
from gateway.policy.access import View
from gateway.protocol.era import Era, handshake_version
from gateway.protocol.errors import State

Json = dict[str, Any]
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
VIEWED = ("prompts", "resources", "completions", "logging", "tasks")
CHANGES = NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)


class ManifoldServer(Server[Any]):
    """The SDK's low-level server, advertising `listChanged` to 2025-era clients too, and only the capabilities
    some server behind the gateway offers."""

    offered: set[str] | None = None

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        offered = self.offered
        if offered is None:
            return capabilities
        update: Json = {}
        for name in ("prompts", "resources", "completions", "logging"):
            if name not in offered:
                update[name] = None
        if "tasks" in offered and not Era.of(protocol_version).modern:
            update["tasks"] = types.ServerTasksCapability.model_validate(
                {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
            )
        if "resources" in offered and capabilities.resources is not None and "subscribe" not in offered:
            update["resources"] = capabilities.resources.model_copy(update={"subscribe": False})
        return capabilities.model_copy(update=update)

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or CHANGES,
            experimental_capabilities,
            extensions,
        )


def offered(registry: Registry, view: View | None = None) -> set[str]:
    """The capabilities some server that is up (and in `view`) offers (`subscribe`: one can follow resources)."""
    found: set[str] = set()
    for upstream in registry.upstreams.values():
        if upstream.state is State.UP and (view is None or view.sees(upstream.name)):
            caps = upstream.offers.capabilities
            found.update(k for k in VIEWED if k in caps)
            if (caps.get("resources") or {}).get("subscribe"):
                found.add("subscribe")
            if TASKS_EXTENSION in (caps.get("extensions") or {}):
                found.add(TASKS_EXTENSION)
    return found


def narrowed(registry: Registry, result: HandlerResult, view: View) -> HandlerResult:
    """A handshake's (or discovery's) capabilities, less what no server in the caller's view offers."""
    if not isinstance(result, dict) or not isinstance(result.get("capabilities"), dict):
        return result
    offers = offered(registry, view)
    capabilities = {k: v for k, v in result["capabilities"].items() if k not in VIEWED or k in offers}
    if TASKS_EXTENSION in offers and "supportedVersions" in result:  # a 2026 discovery
        capabilities["extensions"] = {**capabilities.get("extensions", {}), TASKS_EXTENSION: {}}
    resources = capabilities.get("resources")
    if isinstance(resources, dict) and "subscribe" not in offers:
        capabilities["resources"] = {k: v for k, v in resources.items() if k != "subscribe"}
    return {**result, "capabilities": capabilities}


def handshake(server: ManifoldServer, registry: Registry, params: Any, view: View) -> tuple[Json, str] | None:
    """The result of a 2025-era `initialize` with `params` as the SDK's server gives it (for `view`), and the
    protocol version it settles on; None when the params are not valid (the SDK words the refusal)."""
    try:
        requested = types.InitializeRequestParams.model_validate(params, by_name=False).protocol_version
    except ValidationError:
        return None
    version = handshake_version(requested)
    options = server.create_initialization_options()
    result = types.InitializeResult(
        protocol_version=version,
        capabilities=options.capabilities,
        server_info=types.Implementation(
            name=options.server_name,
            title=options.title,
            description=options.description,
            version=options.server_version,
            website_url=options.website_url,
            icons=options.icons,
        ),
        instructions=options.instructions,
    )
    dumped = serialize_server_result(
        "initialize", version, result.model_dump(by_alias=True, mode="json", exclude_none=True)
    )
    shaped: Json = narrowed(registry, dumped, view)  # type: ignore[assignment]
    return shaped, version

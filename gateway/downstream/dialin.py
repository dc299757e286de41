"""`/workers`: where workers dial in. Who may offer what, and the admission of each connection.

A worker opens a WebSocket to `/workers?name=NAME` with `Authorization: Bearer <token>`. The token
must name NAME (or a glob matching it) in `may_offer`; NAME may not be a server of the gateway's own
(config or runtime) nor another server's prefix. A refused connection is accepted and closed at once
with a close code and a reason the worker can show (see the codes in `gateway/upstream/workerpool.py`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

import anyio
from starlette.websockets import WebSocket

from gateway.config.access import TokenSpec
from gateway.config.servers import NAME_PATTERN, ServerSpec
from gateway.config.settings import WorkerSettings
from gateway.core.registry import NameTaken, Registry
from gateway.observe.logs import get_logger
from gateway.policy.access import TokenTable
from gateway.protocol.naming import reserved_problem
from gateway.upstream.departures import Departures
from gateway.upstream.transports.websocket import (
    BAD_REQUEST,
    CONFLICT,
    FORBIDDEN,
    TOO_MANY,
    UNAUTHORIZED,
    Refusal,
    SocketEnd,
)
from gateway.upstream.workerpool import WorkerLink

log = get_logger("workers")
CLOSED = Refusal(1000, "closed", "closed")


class WorkerDoor:
    """The `/workers` WebSocket endpoint (`serve`)."""

    def __init__(
        self, registry: Registry, tokens: Iterable[TokenSpec], limits: WorkerSettings, max_message_bytes: int
    ) -> None:
        self.registry = registry
        self.tokens = TokenTable(tokens)
        self.limits = limits
        self.max_message_bytes = max_message_bytes
        self.departures = Departures(
            registry.pins.store,
            self._forget,
            lambda name: name in registry.upstreams,
            forget_after=limits.forget_after,
            keep=limits.max_departed,
        )
        self._names: dict[str, Counter[str]] = defaultdict(Counter)  # token name -> names its workers offer

    async def _forget(self, name: str) -> None:
        """Delete what a departed name left behind: its metric series and its pins."""
        self.registry.metrics.forget_worker(name)
        await self.registry.pins.drop(name)

    def spec_for(self, name: str, token: TokenSpec) -> ServerSpec:
        """The options of a server offered by workers under `name` with `token`."""
        limits = self.limits
        return ServerSpec.model_validate(
            {
                "name": name,
                "transport": "worker",
                "trusted": token.trusted_worker,
                "timeout": limits.timeout,
                "max_concurrent": limits.max_concurrent,
                "max_queued": limits.max_queued,
            }
        )

    def check(self, token: TokenSpec | None, name: str) -> Refusal | None:
        """Why a connection presenting `token` may not offer `name`, or None."""
        if token is None:
            return Refusal(UNAUTHORIZED, "a valid API token is required to offer tools", "unauthorized")
        if not NAME_PATTERN.fullmatch(name):
            return Refusal(
                BAD_REQUEST,
                "give the name to offer as ?name=NAME (letters, digits, '.', '_' or '-', at most 64)",
                "bad_name",
            )
        if (reserved := reserved_problem(name)) is not None:
            return Refusal(BAD_REQUEST, reserved, "bad_name")
        if not token.may_offer_name(name):
            return Refusal(FORBIDDEN, f"token '{token.name}' may not offer '{name}' (see its may_offer)", "forbidden")
        offered = self._names[token.name]
        if name not in offered and len(offered) >= self.limits.max_names_per_token:
            why = f"token '{token.name}' already offers {len(offered)} names (workers.max_names_per_token)"
            return Refusal(TOO_MANY, why, "too_many_names")
        return None

    async def serve(self, websocket: WebSocket) -> None:
        """Serve one worker's connection, from its admission to its end."""
        token = self.tokens.identify(websocket.headers.get("authorization", "").encode("latin-1"))
        name = websocket.query_params.get("name", "")
        await websocket.accept()
        limits = self.limits
        socket = SocketEnd(
            websocket, max_bytes=self.max_message_bytes, queue=limits.send_queue, send_timeout=limits.send_timeout
        )
        refusal = self.check(token, name)
        if refusal is not None or token is None:
            await self._refused(socket, refusal or CLOSED, name[:64], token.name if token is not None else "")
            return
        link: WorkerLink | None = None
        offered = self._names[token.name]
        offered[name] += 1
        try:
            await self.departures.back(name)
            async with self.registry.worker_pool(self.spec_for(name, token)) as pool:
                link = WorkerLink(
                    pool,
                    socket,
                    token.name,
                    max_tools=limits.max_tools,
                    heartbeat_interval=limits.heartbeat_interval,
                    heartbeat_timeout=limits.heartbeat_timeout,
                )
                log.info("worker connected", server=name, worker=link.id, token_name=token.name)
                await pool.serve(link)
        except NameTaken:
            refusal = Refusal(CONFLICT, f"'{name}' is the name or prefix of a server the gateway has", "clash")
        except Refusal as e:
            refusal = e
        finally:
            offered[name] -= 1
            if offered[name] <= 0:
                del offered[name]
            if name not in self.registry.upstreams:
                with anyio.CancelScope(shield=True):
                    await self.departures.left(name)
        if refusal is not None or link is None:
            await self._refused(socket, refusal or CLOSED, name, token.name)
            return
        ending = link.refusal or socket.problem or CLOSED
        if link.admitted:
            self.registry.metrics.count_worker_disconnect(name, ending.kind)
            log.info(
                "worker disconnected", server=name, worker=link.id, reason=link.error or ending.reason, calls=link.calls
            )
        else:
            self.registry.metrics.count_worker_refusal(ending.kind if ending is not CLOSED else "failed")
            log.warning("worker not admitted", server=name, worker=link.id, reason=link.error or ending.reason)
            if (audit := self.registry.metrics.audit) is not None:
                kind = ending.kind if ending is not CLOSED else "failed"
                audit.act("worker_refused", who=token.name, outcome="refused", server=name, reason=kind)
        await socket.close(ending)

    async def _refused(self, socket: SocketEnd, refusal: Refusal, name: str, who: str = "") -> None:
        self.registry.metrics.count_worker_refusal(refusal.kind)
        log.warning("worker refused", server=name, reason=refusal.reason, code=refusal.code)
        if (audit := self.registry.metrics.audit) is not None:
            audit.act("worker_refused", who=who, outcome="refused", server=name, reason=refusal.kind)
        await socket.close(refusal)

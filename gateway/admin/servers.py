"""Runtime servers: added and removed through the admin API, kept in a store, reconciled across replicas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio

from gateway.config.credentials import use_problems
from gateway.config.servers import ServerSpec, parse_server
from gateway.config.settings import Settings
from gateway.core.registry import NameTaken, Registry
from gateway.observe.logs import get_logger
from gateway.policy.egress import EgressPolicy, check_url
from gateway.protocol.errors import EgressDenied, describe
from gateway.store import Options, Store, StoreError

log = get_logger("runtime")
SECRET_KEYS = ("headers", "env")


class RuntimeError_(Exception):
    """An admin request that cannot be carried out: an HTTP status and every reason."""

    def __init__(self, status: int, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.status, self.errors = status, errors


@dataclass
class StoreHealth:
    """Whether the store answered last time, and if not, why."""

    ok: bool = True
    error: str | None = None


def _has_placeholder(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_has_placeholder(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_placeholder(v) for v in value)
    return False


class Runtime:
    """Validates runtime servers, writes them to the store, and keeps this replica's registry in step."""

    def __init__(self, registry: Registry, store: Store, settings: Settings) -> None:
        self.registry, self.store, self.settings = registry, store, settings
        self.egress = EgressPolicy.from_allow(settings.runtime.egress.allow)
        self.health = StoreHealth()
        self.bad_rows: dict[str, str] = {}  # stored rows that cannot be read back: name -> why (never the row)
        self._lock = anyio.Lock()
        self._applied: dict[str, Options] = {}
        self._wake = anyio.Event()

    def egress_for(self, spec: ServerSpec) -> EgressPolicy | None:
        """The egress rules a runtime server connects under: always, but for a stdio server while `runtime.stdio`
        allows those (it has no address to check; without it, the connection refuses the command)."""
        return None if spec.kind == "stdio" and self.settings.runtime.stdio else self.egress

    async def validate(self, body: Any) -> tuple[ServerSpec, Options]:
        """The spec and storable options of an add request, or `RuntimeError_(422, every problem)`."""
        if not isinstance(body, dict):
            raise RuntimeError_(422, ["the body must be a JSON object with a `name` and server options"])
        name = body.get("name")
        if not isinstance(name, str):
            raise RuntimeError_(422, ["name: required, a string"])
        options = {k: v for k, v in body.items() if k != "name"}
        problems: list[str] = []
        for key in SECRET_KEYS:
            if key in options:
                problems.append(
                    f"{key}: runtime servers carry no secrets; define them under `credentials` in the gateway's "
                    "config and refer to them with `credential: <name>`"
                )
        if _has_placeholder(options):
            problems.append("options are taken as data: `${...}` is not filled in for runtime servers")
        credential = options.get("credential")
        if credential is not None and credential not in self.settings.credentials:
            problems.append(f"credential: no credential named {credential!r} in the gateway's config")
        spec = parse_server(name, options, "server", problems)
        if spec is not None and spec.credential in self.settings.credentials:
            problems += use_problems(spec, spec.credential, self.settings.credentials[spec.credential])
        if spec is not None:
            if spec.command is not None and not self.settings.runtime.stdio:
                problems.append("command: runtime servers must use HTTP(S) (a stdio server needs runtime.stdio: true)")
            elif spec.url is not None:
                try:
                    await check_url(spec.url, self.egress)
                except EgressDenied as e:
                    problems.append(f"url: {e}")
        if problems or spec is None:
            raise RuntimeError_(422, problems)
        return spec, options

    async def add(self, body: Any) -> ServerSpec:
        """Add a server: validate, check the name is free, store it, start it."""
        spec, options = await self.validate(body)
        async with self._lock:
            if spec.name in self.registry.upstreams:
                raise RuntimeError_(409, [f"a server named {spec.name!r} already exists"])
            if not await self._store_call(self.store.add(spec.name, options)):
                raise RuntimeError_(409, [f"a server named {spec.name!r} already exists (in the store)"])
            try:
                await self.registry.add(spec, "runtime", self.egress_for(spec))
            except NameTaken:  # a config reload took the name since the check above: undo the store's row
                await self._store_call(self.store.remove(spec.name))
                raise RuntimeError_(409, [f"a server named {spec.name!r} already exists"]) from None
            self._applied[spec.name] = options
        log.info("runtime server added", server=spec.name)
        if (audit := self.registry.metrics.audit) is not None:
            audit.act("server_added", server=spec.name, transport=spec.kind)
        return spec

    async def remove(self, name: str) -> None:
        """Remove a runtime server and close every connection to it."""
        async with self._lock:
            upstream = self.registry.upstreams.get(name)
            if upstream is None:
                raise RuntimeError_(404, [f"no server named {name!r}"])
            if upstream.source == "worker":
                raise RuntimeError_(409, [f"server {name!r} is offered by workers; it leaves when they disconnect"])
            if upstream.source != "runtime":
                raise RuntimeError_(409, [f"server {name!r} comes from the config file; change it there"])
            await self._store_call(self.store.remove(name))
            # Only a runtime server: should a reload have given the name to the config file meanwhile, that stays.
            await self.registry.remove(name, source="runtime")
            self._applied.pop(name, None)
        log.info("runtime server removed", server=name)
        if (audit := self.registry.metrics.audit) is not None:
            audit.act("server_removed", server=name)

    async def _store_call(self, call: Any) -> Any:
        try:
            result = await call
        except StoreError as e:
            self._degraded(str(e))
            raise RuntimeError_(503, [f"the store is unavailable: {e}"]) from None
        self._healthy()
        return result

    def _degraded(self, error: str) -> None:
        if self.health.ok:
            log.warning("store unavailable; serving what is known", reason=error)
            self.health = StoreHealth(ok=False, error=error)
            self._wake.set()
        else:
            self.health.error = error

    def _healthy(self) -> None:
        if not self.health.ok:
            log.info("store available again")
        self.health = StoreHealth()

    def _note_bad_rows(self, bad: dict[str, str]) -> None:
        """Remember, log (by name only: a row's text may hold anything) and export the unreadable rows."""
        for name, reason in bad.items():
            if self.bad_rows.get(name) != reason:
                log.warning("stored server row cannot be read; skipped", server=name, reason=reason)
        for name in self.bad_rows.keys() - bad.keys():
            log.info("stored server row no longer unreadable", server=name)
        if bad != self.bad_rows:
            self.registry.metrics.set_bad_rows(bad)
        self.bad_rows = bad

    async def reconcile(self) -> None:
        """Make this replica's runtime servers match the store: start, stop or restart what differs.
        A row that cannot be read is skipped (a server already running under its name keeps running)."""
        async with self._lock:
            try:
                loaded = await self.store.load()
            except StoreError as e:
                self._degraded(str(e))
                return
            self._healthy()
            self._note_bad_rows(loaded.bad)
            desired = loaded.servers
            for name in [n for n in self._applied if n not in desired and n not in loaded.bad]:
                del self._applied[name]
                if await self.registry.remove(name, source="runtime"):
                    log.info("runtime server removed by another replica", server=name)
            for name, options in desired.items():
                existing = self.registry.upstreams.get(name)
                if existing is not None and existing.source != "runtime":
                    log.warning("stored server shadowed by the config file", server=name)
                    continue
                if existing is not None and self._applied.get(name) == options:
                    continue
                problems: list[str] = []
                spec = parse_server(name, options, f"store.{name}", problems)
                if spec is None:
                    log.warning("stored server is invalid; skipped", server=name, problems=problems)
                    continue
                try:
                    await self.registry.replace(spec, "runtime", self.egress_for(spec), replacing="runtime")
                except NameTaken:  # the config file took the name since the check above
                    log.warning("stored server shadowed by the config file", server=name)
                    continue
                self._applied[name] = options
                log.info("runtime server applied from the store", server=name)

    async def _reconcile_or_log(self) -> None:
        """`reconcile`, where a failure is logged and left to the next round instead of ending the gateway."""
        try:
            await self.reconcile()
        except Exception as e:
            log.error("reconcile failed; the next round tries again", reason=f"{type(e).__name__}: {describe(e)}")

    async def _refresh_pins_or_log(self) -> None:
        try:
            await self.registry.refresh_pins()
        except Exception as e:
            log.error("pins refresh failed; the next round tries again", reason=f"{type(e).__name__}: {describe(e)}")

    async def run(self) -> None:
        """Load the store, then follow its change announcements and re-read it every `reconcile_interval`."""
        try:
            await self.store.start()
        except StoreError as e:
            self._degraded(str(e))
        await self._reconcile_or_log()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow_changes)
            while True:
                # While the store is unreachable, try again every second to catch up as soon as it returns.
                with anyio.move_on_after(self.settings.reconcile_interval if self.health.ok else 1.0):
                    await self._wake.wait()
                self._wake = anyio.Event()
                await self._reconcile_or_log()
                await self._refresh_pins_or_log()

    async def _follow_changes(self) -> None:
        async for reason in self.store.changes():
            if reason.startswith("error: "):
                self._degraded(reason.removeprefix("error: "))
                continue
            if reason.startswith(("oauth ", "session ")):
                continue  # a credential's tokens, renewed by a replica, or a 2025-era session (`downstream.replicas`)
            if not reason.startswith("pins "):
                await self._reconcile_or_log()
            if reason.startswith("pins ") or reason == "subscribed":
                await self._refresh_pins_or_log()

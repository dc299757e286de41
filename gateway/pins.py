"""Tool-definition pinning: what the model sees of each tool is pinned (on a server's first complete listing,
or by an operator's approval) and every later listing is judged against the pins.

A pin is keyed by server and original tool name, and holds the digest and the text of the definition as
served (public name, title, description, input and output schema, annotations; after overrides). With
`pin: hold` a tool that is new or unlike its pin is held back from listings and calls; with `warn` it is
served, logged and counted; with `off` nothing is judged. Pins live in the store, so an approval on one
replica holds on every replica that shares it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.admin.store import Store
from gateway.catalog import Entry
from gateway.config import PinMode
from gateway.logs import get_logger

log = get_logger("pins")

Status = Literal["pinned", "changed", "new", "unknown"]
KIND = "pins"
SEEN = ""  # the tool part of a server's marker row: its first complete listing has been pinned
VISIBLE = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
Json = dict[str, Any]


def visible(entry: Entry) -> Json:
    """What the model sees of a served tool (its `_meta` labels are the gateway's own, not the server's). The
    name is the one before a collision's hash: another server arriving must not re-hold a reviewed tool."""
    definition = {key: entry.tool[key] for key in VISIBLE if key in entry.tool}
    if entry.base:
        definition["name"] = entry.base
    return definition


def digest(definition: Json) -> str:
    """A stable digest of a definition: SHA-256 over its canonical JSON."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def pin_key(server: str, tool: str) -> str:
    """The store key of a pin. Server names never hold `/`, so the first `/` splits it."""
    return f"{server}/{tool}"


def readable_diff(pinned: Json | None, offered: Json | None, server: str, tool: str) -> str:
    """A unified diff of two definitions, one JSON key per line, for a person to review."""

    def lines(definition: Json | None) -> list[str]:
        if definition is None:
            return []
        return json.dumps(definition, sort_keys=True, indent=2, ensure_ascii=False).splitlines(keepends=True)

    diff = difflib.unified_diff(
        lines(pinned), lines(offered), f"{server}/{tool} (pinned)", f"{server}/{tool} (offered)"
    )
    return "".join(diff)


@dataclass(frozen=True)
class Pin:
    """One approved definition."""

    server: str
    tool: str
    digest: str
    definition: Json
    how: str  # "first use" or "approved"
    at: float

    def row(self) -> Json:
        """The pin as a store row."""
        return {"digest": self.digest, "definition": self.definition, "how": self.how, "at": self.at}


@dataclass(frozen=True)
class Judged:
    """One offered tool against its pin."""

    entry: Entry
    status: Status
    offered: str
    pin: Pin | None


class Pins:
    """The pins this replica has read from the store, and the judgement of catalog entries against them.

    `mode_of(server)` says a server's pin mode. Until the store has been read once, nothing is known: a
    `hold` server's tools are held (fail closed) and a `warn` server's are served.
    """

    def __init__(self, store: Store, mode_of: Callable[[str], PinMode]) -> None:
        self.store = store
        self.mode_of = mode_of
        self.loaded = False
        self._pins: dict[tuple[str, str], Pin] = {}
        self._seen: set[str] = set()
        self._reported: set[tuple[str, str, str]] = set()  # (server, tool, offered digest) already logged

    def pins(self, server: str | None = None) -> list[Pin]:
        """The pins of one server, or of every server, sorted."""
        return [p for (s, _), p in sorted(self._pins.items()) if server is None or s == server]

    def pin_of(self, server: str, tool: str) -> Pin | None:
        """The pin of one tool, if there is one."""
        return self._pins.get((server, tool))

    def seen(self, server: str) -> bool:
        """Whether a server's first complete listing has been pinned."""
        return server in self._seen

    def judge(self, entry: Entry) -> Judged:
        """How an offered tool stands against its pin."""
        offered = digest(visible(entry))
        if not self.loaded:
            return Judged(entry, "unknown", offered, None)
        pin = self._pins.get((entry.server, entry.original))
        if pin is None:
            # Before the first listing is pinned, a tool is judged as pinned: it is about to be, as offered.
            return Judged(entry, "new" if entry.server in self._seen else "pinned", offered, None)
        return Judged(entry, "pinned" if pin.digest == offered else "changed", offered, pin)

    def holds(self, entry: Entry) -> bool:
        """Whether a tool is held back: its server is on `hold` and the tool is not as pinned."""
        return self.mode_of(entry.server) == "hold" and self.judge(entry).status != "pinned"

    async def load(self) -> bool:
        """Read every pin from the store; True when what this replica knows changed. `StoreError` if unreadable."""
        loaded = await self.store.records(KIND)
        pins: dict[tuple[str, str], Pin] = {}
        seen: set[str] = set()
        for key, row in loaded.servers.items():
            server, _, tool = key.partition("/")
            if tool == SEEN:
                seen.add(server)
                continue
            definition, value = row.get("definition"), row.get("digest")
            if not isinstance(definition, dict) or not isinstance(value, str):
                loaded.bad[key] = "not a pin"
                continue
            at = row.get("at")
            pins[(server, tool)] = Pin(
                server, tool, value, definition, str(row.get("how", "")), at if isinstance(at, float) else 0.0
            )
        for key, reason in loaded.bad.items():
            log.warning("stored pin cannot be read; the tool is judged as unpinned", pin=key[:200], reason=reason)
        changed = not self.loaded or pins != self._pins or seen != self._seen
        self._pins, self._seen, self.loaded = pins, seen, True
        return changed

    async def first_use(self, server: str, entries: Iterable[Entry]) -> None:
        """Pin a server's first complete listing as offered (where no replica pinned it first)."""
        now = time.time()
        for entry in entries:
            definition = visible(entry)
            pin = Pin(server, entry.original, digest(definition), definition, "first use", now)
            await self.store.put_record(KIND, pin_key(server, entry.original), pin.row(), only_new=True)
        await self.store.put_record(KIND, pin_key(server, SEEN), {"at": now}, only_new=True)
        log.info("first listing pinned", server=server)
        await self.load()

    async def approve(self, entries: Iterable[Entry]) -> list[Pin]:
        """Pin these tools as they are offered now; the pins written."""
        now = time.time()
        written = []
        for entry in entries:
            definition = visible(entry)
            pin = Pin(entry.server, entry.original, digest(definition), definition, "approved", now)
            await self.store.put_record(KIND, pin_key(entry.server, entry.original), pin.row())
            written.append(pin)
            log.info("tool definition approved", server=entry.server, tool=entry.original, digest=pin.digest)
        servers = {pin.server for pin in written}
        for server in servers:
            await self.store.put_record(KIND, pin_key(server, SEEN), {"at": now}, only_new=True)
        await self.load()
        return written

    def report(self, judged: Judged) -> bool:
        """Log a definition unlike its pin once per offered digest; True the first time (to be counted)."""
        entry = judged.entry
        key = (entry.server, entry.original, judged.offered)
        if judged.status in ("pinned", "unknown") or key in self._reported:
            return False
        self._reported.add(key)
        mode = self.mode_of(entry.server)
        log.warning(
            "tool held: its definition does not match its pin" if mode == "hold" else "tool definition unlike its pin",
            server=entry.server,
            tool=entry.original,
            status=judged.status,
            pinned=judged.pin.digest if judged.pin is not None else None,
            offered=judged.offered,
            mode=mode,
        )
        return True

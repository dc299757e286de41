"""Tool-definition pinning: what a client receives of each tool is pinned (on a server's first complete listing,
or by an operator's approval) and every later listing is judged against the pins.

A pin is keyed by server and original tool name, and holds the digest and the text of the definition as
served: every key of the tool (name, title, description, schemas, annotations, `_meta`, icons, execution, and
any other), after overrides, less only the labels the gateway writes into `_meta` itself. With `pin: hold` a
tool that is new or unlike its pin is held back from listings and calls; with `warn` it is served, logged
and counted; with `off` nothing is judged. Pins live in the store, so an approval on one replica holds on
every replica that shares it.

An approval may carry the digest the operator reviewed: it is refused when the tool's definition changed
since. Without one it approves the definition offered when it is applied.

Pins stored by earlier versions (form 1) hold only name, title, description, schemas and annotations. Such a
pin still judges those keys; when they match, the pin is completed with the rest of the tool as offered then
(`upgrade`), so an upgrade holds no tool that did not change, and from then on every key is pinned.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.catalog.labels import META_PREFIX
from gateway.catalog.merged import Entry
from gateway.config.servers import PinMode
from gateway.observe.logs import get_logger
from gateway.store import Store, StoreError

log = get_logger("pins")

Status = Literal["pinned", "changed", "new", "unknown"]
KIND = "pins"
SEEN = ""  # the tool part of a server's marker row: its first complete listing has been pinned
UNSTORED = "first use (not stored yet)"  # how a first-use pin the store refused is shown until it takes it
FORM = 2  # what a pin holds: 2, the whole tool as served; 1 (earlier versions), the keys of FORM_1 only
FORM_1 = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
OWN_LABELS = frozenset(f"{META_PREFIX}{key}" for key in ("server", "tool", "trust", "gated"))
DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
Json = dict[str, Any]


def visible(entry: Entry) -> Json:
    """Everything a client receives of a served tool, less the labels the gateway writes into its `_meta` (they
    are the gateway's word, not the server's). The name is the one before a collision's hash: another server
    arriving must not re-hold a reviewed tool."""
    definition = {key: value for key, value in entry.tool.items() if key != "_meta"}
    meta = entry.tool.get("_meta")
    theirs = {k: v for k, v in meta.items() if k not in OWN_LABELS} if isinstance(meta, dict) else {}
    if theirs:
        definition["_meta"] = theirs
    if entry.base:
        definition["name"] = entry.base
    return definition


def visible_form_1(entry: Entry) -> Json:
    """The part of a tool an earlier version's pin (form 1) holds."""
    definition = {key: entry.tool[key] for key in FORM_1 if key in entry.tool}
    if entry.base:
        definition["name"] = entry.base
    return definition


def digest(definition: Json) -> str:
    """A stable digest of a definition: SHA-256 over its canonical JSON."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def given_digest(text: str) -> str | None:
    """A digest as an operator gives it (`sha256:<64 hex>`, or the 64 hex alone), in the form pins use; None
    when it is not one."""
    found = DIGEST.fullmatch(text.strip().lower())
    return f"sha256:{found.group(1)}" if found else None


class ChangedSinceReview(Exception):
    """An approval named digests that are no longer what the tools offer; nothing was approved."""

    def __init__(self, server: str, changes: list[tuple[str, str, str]]) -> None:
        self.server, self.changes = server, changes  # (tool, reviewed digest, offered digest)
        told = "; ".join(
            f"'{tool}' was reviewed as {reviewed} and is offered now as {offered}"
            for tool, reviewed, offered in changes
        )
        super().__init__(
            f"the definition changed since it was reviewed, so nothing was approved: {told}; review it again "
            f"(`manifold pins diff {server} {changes[0][0]}`)"
        )


def pin_key(server: str, tool: str) -> str:
    """The store key of a pin. Server names never hold `/`, so the first `/` splits it."""
    return f"{server}/{tool}"


def definition_lines(definition: Json | None) -> list[str]:
    """A definition as a person reviews it: its JSON, one key per line (with line ends)."""
    if definition is None:
        return []
    return json.dumps(definition, sort_keys=True, indent=2, ensure_ascii=False).splitlines(keepends=True)


def readable_diff(pinned: Json | None, offered: Json | None, server: str, tool: str) -> str:
    """A unified diff of two definitions, one JSON key per line, for a person to review."""
    diff = difflib.unified_diff(
        definition_lines(pinned), definition_lines(offered), f"{server}/{tool} (pinned)", f"{server}/{tool} (offered)"
    )
    return "".join(diff)


@dataclass(frozen=True)
class Pin:
    """One approved definition."""

    server: str
    tool: str
    digest: str
    definition: Json
    how: str  # "first use", "approved" or "upgraded"
    at: float
    form: int = FORM

    def row(self) -> Json:
        """The pin as a store row."""
        return {"digest": self.digest, "definition": self.definition, "how": self.how, "at": self.at, "form": self.form}


@dataclass(frozen=True)
class Judged:
    """One offered tool against its pin."""

    entry: Entry
    status: Status
    offered: str
    pin: Pin | None


def _unstored(pins: Iterable[Pin]) -> dict[tuple[str, str], Pin]:
    """First-use pins the store refused, as this replica holds them until it takes them."""
    return {(pin.server, pin.tool): replace(pin, how=UNSTORED) for pin in pins}


class Pins:
    """The pins this replica has read from the store, and the judgement of catalog entries against them.

    `mode_of(server)` says a server's pin mode. Until the store has been read once, nothing is known: a
    `hold` server's tools are held (fail closed) and a `warn` server's are served. A first listing the store
    refuses to take is pinned in memory, so later listings are judged against it, and is written by
    `store_pending` once the store takes writes again.
    """

    def __init__(self, store: Store, mode_of: Callable[[str], PinMode]) -> None:
        self.store = store
        self.mode_of = mode_of
        self.loaded = False
        self._pins: dict[tuple[str, str], Pin] = {}
        self._seen: set[str] = set()
        self._unstored: dict[str, list[Pin]] = {}  # first listings the store refused, by server
        self._reported: set[tuple[str, str, str]] = set()  # (server, tool, offered digest) already logged
        self._digests: dict[tuple[str, str], tuple[Json, str]] = {}  # (server, tool) -> (tool as served, digest)

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
        offered = self._digest(entry)
        if not self.loaded:
            return Judged(entry, "unknown", offered, None)
        pin = self._pins.get((entry.server, entry.original))
        if pin is None:
            # Before the first listing is pinned, a tool is judged as pinned: it is about to be, as offered.
            return Judged(entry, "new" if entry.server in self._seen else "pinned", offered, None)
        if pin.form < FORM:  # an earlier version's pin: it judges what it holds, until `upgrade` completes it
            return Judged(entry, "pinned" if pin.digest == digest(visible_form_1(entry)) else "changed", offered, pin)
        return Judged(entry, "pinned" if pin.digest == offered else "changed", offered, pin)

    def _digest(self, entry: Entry) -> str:
        """The digest of what a client receives of a tool, computed once per definition served."""
        key = (entry.server, entry.original)
        known = self._digests.get(key)
        if known is not None and known[0] is entry.tool:
            return known[1]
        offered = digest(visible(entry))
        self._digests[key] = (entry.tool, offered)
        return offered

    def forget(self, server: str) -> None:
        """Drop what was computed for a server that is gone (its pins stay in the store)."""
        for key in [k for k in self._digests if k[0] == server]:
            del self._digests[key]
        self._reported = {r for r in self._reported if r[0] != server}

    async def drop(self, server: str) -> None:
        """Delete every pin of a server from the store (its next listing is pinned as on first use)."""
        for key in [*(pin_key(server, tool) for s, tool in self._pins if s == server), pin_key(server, SEEN)]:
            await self.store.delete_record(KIND, key)
        self._pins = {k: pin for k, pin in self._pins.items() if k[0] != server}
        self._seen.discard(server)
        self._unstored.pop(server, None)
        self.forget(server)

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
            at, form = row.get("at"), row.get("form", 1)
            pins[(server, tool)] = Pin(
                server,
                tool,
                value,
                definition,
                str(row.get("how", "")),
                at if isinstance(at, float) else 0.0,
                form if isinstance(form, int) else 1,
            )
        for key, reason in loaded.bad.items():
            log.warning("stored pin cannot be read; the tool is judged as unpinned", pin=key[:200], reason=reason)
        # A first listing the store has not taken yet stays pinned here; one the store has (this replica's, written
        # since, or another replica's) replaces it.
        self._unstored = {server: kept for server, kept in self._unstored.items() if server not in seen}
        for server, kept in self._unstored.items():
            seen.add(server)
            pins.update(_unstored(kept))
        changed = not self.loaded or pins != self._pins or seen != self._seen
        self._pins, self._seen, self.loaded = pins, seen, True
        return changed

    async def first_use(self, server: str, entries: Iterable[Entry]) -> None:
        """Pin a server's first complete listing as offered (where no replica pinned it first). `StoreError` when
        the store refuses it: it is then pinned in memory until `store_pending` writes it."""
        now = time.time()
        pins = [Pin(server, e.original, digest(d := visible(e)), d, "first use", now) for e in entries]
        try:
            await self._store_first_use(server, pins)
        except StoreError:
            self._unstored[server] = pins
            self._pins.update(_unstored(pins))
            self._seen.add(server)
            raise

    async def store_pending(self) -> None:
        """Write the first listings the store refused before (`StoreError` if it still refuses)."""
        for server, pins in list(self._unstored.items()):
            await self._store_first_use(server, pins)
            self._unstored.pop(server, None)

    async def _store_first_use(self, server: str, pins: list[Pin]) -> None:
        written: list[Pin] = []
        for pin in pins:
            if await self.store.put_record(KIND, pin_key(server, pin.tool), pin.row(), only_new=True):
                written.append(pin)
        first = await self.store.put_record(
            KIND, pin_key(server, SEEN), {"at": pins[0].at if pins else time.time()}, only_new=True
        )
        log.info("first listing pinned", server=server)
        if first and len(written) == len(pins):
            # nobody else pinned this server: what was written is all there is to know of it
            self._pins.update({(server, pin.tool): pin for pin in written})
            self._seen.add(server)
        else:
            await self.load()

    async def upgrade(self, entries: Iterable[Entry]) -> bool:
        """Complete the earlier version's pins (form 1) of these tools that still match: the keys they did not
        hold are pinned as offered now. True when a pin was written."""
        now, written = time.time(), False
        for entry in entries:
            pin = self._pins.get((entry.server, entry.original))
            if pin is None or pin.form >= FORM or pin.digest != digest(visible_form_1(entry)):
                continue
            definition = visible(entry)
            done = Pin(entry.server, entry.original, digest(definition), definition, "upgraded", now)
            await self.store.put_record(KIND, pin_key(entry.server, entry.original), done.row())
            log.info("pin completed to the whole tool", server=entry.server, tool=entry.original, digest=done.digest)
            written = True
        if written:
            await self.load()
        return written

    async def approve(self, entries: Iterable[Entry], reviewed: bool = False) -> list[Pin]:
        """Pin these tools as they are offered now (`reviewed`: the operator's digest was checked); the pins
        written."""
        now = time.time()
        written = []
        for entry in entries:
            definition = visible(entry)
            pin = Pin(entry.server, entry.original, digest(definition), definition, "approved", now)
            await self.store.put_record(KIND, pin_key(entry.server, entry.original), pin.row())
            written.append(pin)
            log.info(
                "tool definition approved",
                server=entry.server,
                tool=entry.original,
                digest=pin.digest,
                reviewed=reviewed,
            )
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

"""Runtime servers in Redis, shared by every replica; changes are announced with pub/sub."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.store import Loaded, Options, StoreError, decode_rows

KEY = "manifold:servers"
RECORDS = "manifold:records:"  # one hash per kind of record
CHANNEL = "manifold:servers:changed"
LOCKS = "manifold:lock:"
SESSIONS = "manifold:session:"  # one key per 2025-era session, expiring when idle (see `put_session`)
ASKING = "manifold:asking:"  # per session: the replicas with a question out to its client, and how many
INBOX = "manifold:replica:"  # per replica: what other replicas pass it (answers, handed-over requests, replies)
OWNERS = "manifold:owner:"  # per conversation: the replica whose instances serve it
# The owner of a name: this replica when there is none (or the one it replaces is gone), kept alive by its owner.
CLAIM = """local owner = redis.call('get', KEYS[1])
if not owner or owner == ARGV[1] or owner == ARGV[2] then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return ARGV[1]
end
return owner"""
# Delete the lock only while it is still this holder's: it may have expired and been taken by another.
UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}{parts.path}"


class RedisStore:
    """A hash of name -> options JSON; every add and remove is published on a channel."""

    kind = "redis"

    def __init__(self, url: str) -> None:
        self._where = _where(url)  # never the password
        # Replies stay bytes: a stored value that is not UTF-8 must spoil only its own row (see `load`).
        self._client: Any = aioredis.Redis.from_url(
            url,
            socket_connect_timeout=2,
            socket_timeout=5,
            health_check_interval=10,
            decode_responses=False,
        )

    def _error(self, e: Exception) -> StoreError:
        return StoreError(f"redis store {self._where}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    async def start(self) -> None:
        try:
            await self._client.ping()
        except (RedisError, OSError) as e:
            raise self._error(e) from None

    async def close(self) -> None:
        await self._client.aclose()

    async def load(self) -> Loaded:
        try:
            raw = await self._client.hgetall(KEY)
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return decode_rows(raw.items())

    async def add(self, name: str, options: Options) -> bool:
        try:
            added = await self._client.hsetnx(KEY, name, json.dumps(options, sort_keys=True))
            if added:
                await self._client.publish(CHANNEL, f"add {name}")
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return bool(added)

    async def remove(self, name: str) -> bool:
        try:
            removed = await self._client.hdel(KEY, name)
            if removed:
                await self._client.publish(CHANNEL, f"remove {name}")
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return bool(removed)

    async def records(self, kind: str) -> Loaded:
        try:
            raw = await self._client.hgetall(RECORDS + kind)
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return decode_rows(raw.items())

    async def put_record(self, kind: str, key: str, value: Options, *, only_new: bool = False) -> bool:
        text = json.dumps(value, sort_keys=True)
        try:
            if only_new:
                written = bool(await self._client.hsetnx(RECORDS + kind, key, text))
            else:
                await self._client.hset(RECORDS + kind, key, text)
                written = True
            if written:
                await self._client.publish(CHANNEL, f"{kind} {key}")
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return written

    async def delete_record(self, kind: str, key: str) -> bool:
        try:
            deleted = bool(await self._client.hdel(RECORDS + kind, key))
            if deleted:
                await self._client.publish(CHANNEL, f"{kind} {key}")
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return deleted

    async def put_session(self, key: str, value: bytes, ttl: float, *, announce: bool = False) -> None:
        """Keep a downstream session's record for `ttl` seconds (every replica reads it; see `gateway.downstream
        .replicas`); `announce` tells every replica it changed."""
        try:
            await self._client.set(SESSIONS + key, value, px=max(1, int(ttl * 1000)))
            if announce:
                await self._client.publish(CHANNEL, f"session {key}")
        except (RedisError, OSError) as e:
            raise self._error(e) from None

    async def get_session(self, key: str) -> bytes | None:
        """A session's record, or None when there is none (never opened, deleted or idle past its `ttl`)."""
        try:
            value = await self._client.get(SESSIONS + key)
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return value if isinstance(value, bytes) else None

    async def use_session(self, key: str, ttl: float) -> bytes | None:
        """A session's record, kept `ttl` seconds from now (one round trip); None when it is gone."""
        try:
            value = await self._client.getex(SESSIONS + key, px=max(1, int(ttl * 1000)))
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return value if isinstance(value, bytes) else None

    async def delete_session(self, key: str) -> bool:
        """Delete a session's record; True when there was one. Announced on `changes()` as `"session {key}"`."""
        try:
            deleted = bool(await self._client.delete(SESSIONS + key))
            if deleted:
                await self._client.publish(CHANNEL, f"session {key}")
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return deleted

    async def asking(self, session: str, replica: str, delta: int, ttl: float) -> None:
        """Count a question `replica` put to a session's client (`delta` 1) or its end (-1)."""
        key = ASKING + session
        try:
            left = await self._client.hincrby(key, replica, delta)
            if left <= 0:
                await self._client.hdel(key, replica)
            await self._client.pexpire(key, max(1, int(ttl * 1000)))
        except (RedisError, OSError) as e:
            raise self._error(e) from None

    async def askers(self, session: str) -> list[str]:
        """The replicas with a question out to a session's client."""
        try:
            counts = await self._client.hgetall(ASKING + session)
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return [name.decode(errors="replace") for name, count in counts.items() if int(count) > 0]

    async def send_to(self, replica: str, payload: bytes) -> int:
        """Pass a message to another replica's inbox (see `inbox`); how many received it (0: none is listening)."""
        try:
            return int(await self._client.publish(INBOX + replica, payload))
        except (RedisError, OSError) as e:
            raise self._error(e) from None

    async def replicas(self) -> list[str]:
        """The replicas listening to their inboxes now (alive and reaching Redis)."""
        try:
            channels = await self._client.pubsub_channels(INBOX + "*")
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return [(c.decode() if isinstance(c, bytes) else str(c)).removeprefix(INBOX) for c in channels]

    async def listening(self, replica: str) -> bool:
        """Whether a replica is listening to its inbox (it is alive and reaches Redis)."""
        try:
            counts = await self._client.pubsub_numsub(INBOX + replica)
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return any(int(count) > 0 for _, count in counts)

    async def inbox(self, replica: str) -> AsyncIterator[bytes]:
        """The messages passed to `replica` (forever; resubscribes while Redis is down)."""
        while True:
            try:
                pubsub = self._client.pubsub()
                async with pubsub:
                    await pubsub.subscribe(INBOX + replica)
                    async for message in pubsub.listen():
                        if message.get("type") == "message" and isinstance(message.get("data"), bytes):
                            yield message["data"]
            except (RedisError, OSError):
                await anyio.sleep(1)

    async def claim(self, name: str, replica: str, ttl: float, replacing: str = "") -> str:
        """The replica that owns `name`: `replica` when none does, or the owner is `replacing` (gone), or it is
        `replica` already (its claim then lasts `ttl` more seconds)."""
        try:
            owner = await self._client.eval(CLAIM, 1, OWNERS + name, replica, replacing, max(1, int(ttl * 1000)))
        except (RedisError, OSError) as e:
            raise self._error(e) from None
        return owner.decode(errors="replace") if isinstance(owner, bytes) else str(owner)

    async def lock(self, name: str, token: str, ttl: float) -> bool:
        try:
            return bool(await self._client.set(LOCKS + name, token, nx=True, px=max(1, int(ttl * 1000))))
        except (RedisError, OSError) as e:
            raise self._error(e) from None

    async def unlock(self, name: str, token: str) -> None:
        try:
            await self._client.eval(UNLOCK, 1, LOCKS + name, token)
        except (RedisError, OSError) as e:
            raise self._error(e) from None

    async def changes(self) -> AsyncIterator[str]:
        """Yield on every published change, and once after each (re)subscription; retry while Redis is down."""
        while True:
            try:
                pubsub = self._client.pubsub()
                async with pubsub:
                    await pubsub.subscribe(CHANNEL)
                    yield "subscribed"
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            data = message.get("data")
                            yield data.decode(errors="replace") if isinstance(data, bytes) else str(data)
            except (RedisError, OSError) as e:
                yield f"error: {self._error(e)}"
                await anyio.sleep(1)

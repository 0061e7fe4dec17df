"""Where fleet entries live: Redis, spoken to through redis-py.

The store is untrusted: it hands back bytes that :func:`npumanager.cache.fleet.open_entry`
then verifies. What this module guarantees is only that a node reads a bounded
number of bytes, never waits long, and never confuses a connection failure
with an entry (:class:`FleetUnavailable` vs ``None``).

Layout under the configured prefix, for a key's digest ``D``::

    PREFIX D            manifest: "NPUCHNK1" | total (u64) | chunks (u32) | chunk size (u32)
                        | generation (16 bytes)
    PREFIX D:GEN:I      chunk I of the entry (I = 0 .. chunks-1)

Entries are cut into chunks (64 MiB by default) because one Redis string holds
at most 512 MiB and one huge reply would stall the server for everyone. A
publish writes the new chunks, the manifest and the deletion of the previous
generation's chunks in one MULTI/EXEC transaction, so a reader sees either
the old entry or the new one; a reader that raced a republish between its two
round trips finds chunks missing or short, which is a miss. Chunks are read
with GETRANGE bounded by the manifest's chunk size, so a store that lies about
sizes cannot make a node read more than ``max_entry_bytes``.
"""

from __future__ import annotations

import secrets
import struct
from typing import Any

from npumanager.cache.fleet import FleetKey, FleetRefused
from npumanager.errors import InvalidArgument

DEFAULT_PREFIX = "npu:fleet:v1:"
DEFAULT_CHUNK_BYTES = 64 << 20
_MANIFEST = struct.Struct(">8sQII16s")
_MANIFEST_MAGIC = b"NPUCHNK1"


class FleetUnavailable(Exception):
    """The store could not be reached or did not answer in time (a miss, logged)."""


def _redis() -> Any:
    try:
        import redis
    except ImportError:  # pragma: no cover - the [fleet] extra is missing
        raise InvalidArgument("the fleet cache tier needs the 'redis' package: "
                              "pip install 'npumanager[fleet]'") from None
    return redis


class FleetStore:
    """A Redis holding fleet entries (``redis://``, ``rediss://`` or ``unix://`` URL)."""

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX,
                 connect_timeout_s: float = 1.0, timeout_s: float = 5.0,
                 max_entry_bytes: int = 4 << 30,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if not url:
            raise InvalidArgument("the fleet tier needs a Redis URL")
        if chunk_bytes < 1 or max_entry_bytes < 1:
            raise InvalidArgument("chunk_bytes and max_entry_bytes must be positive")
        redis = _redis()
        self.url = url
        self.prefix = prefix
        self.max_entry_bytes = max_entry_bytes
        self.chunk_bytes = chunk_bytes
        self._errors = (redis.RedisError, OSError)
        try:
            self._client = redis.Redis.from_url(
                url, socket_connect_timeout=connect_timeout_s, socket_timeout=timeout_s,
                retry_on_timeout=False)
        except ValueError as exc:
            raise InvalidArgument(f"fleet redis_url {url!r}: {exc}") from None

    def __repr__(self) -> str:
        return f"<FleetStore {self.url} prefix={self.prefix!r}>"

    def _name(self, key: FleetKey) -> str:
        return self.prefix + key.digest()

    def _chunk_names(self, name: str, gen: bytes, n: int) -> list[str]:
        return [f"{name}:{gen.hex()}:{i}" for i in range(n)]

    def get(self, key: FleetKey) -> bytes | None:
        """The entry's bytes as stored, None if there is none.

        FleetUnavailable when Redis fails; FleetRefused when what is there
        cannot be an entry (a bad manifest, an entry over the bound, chunks
        missing or of the wrong size)."""
        name = self._name(key)
        try:
            # A manifest is tiny: read at most one byte more than one to notice a bigger value.
            raw = self._client.getrange(name, 0, _MANIFEST.size)
            if not raw:
                return None
            if len(raw) != _MANIFEST.size:
                raise FleetRefused(f"malformed manifest ({len(raw)} bytes)")
            magic, total, n, chunk, gen = _MANIFEST.unpack(raw)
            if magic != _MANIFEST_MAGIC:
                raise FleetRefused("malformed manifest (bad magic)")
            if total > self.max_entry_bytes:
                raise FleetRefused(f"entry of {total} bytes exceeds max_entry_bytes "
                                   f"({self.max_entry_bytes})")
            if chunk < 1 or n != -(-total // chunk):
                raise FleetRefused(f"manifest says {n} chunks of {chunk} bytes for {total}")
            pipe = self._client.pipeline(transaction=False)
            for cname in self._chunk_names(name, gen, n):
                pipe.getrange(cname, 0, chunk)  # inclusive end: one byte too many is noticed
            parts: list[bytes] = pipe.execute()
        except self._errors as exc:
            raise FleetUnavailable(f"{type(exc).__name__}: {exc}") from None
        for i, part in enumerate(parts):
            want = min(chunk, total - i * chunk)
            if len(part) != want:
                raise FleetRefused(f"chunk {i} holds {len(part)} bytes, manifest says {want} "
                                   "(truncated, or replaced while read)")
        return b"".join(parts)

    def put(self, key: FleetKey, entry: bytes, *, ttl_s: float = 0.0) -> None:
        """Publish ``entry`` under ``key``, replacing any previous one atomically."""
        if len(entry) > self.max_entry_bytes:
            raise InvalidArgument(f"entry of {len(entry)} bytes exceeds max_entry_bytes")
        name = self._name(key)
        gen = secrets.token_bytes(16)
        n = -(-len(entry) // self.chunk_bytes)
        manifest = _MANIFEST.pack(_MANIFEST_MAGIC, len(entry), n, self.chunk_bytes, gen)
        px = int(ttl_s * 1000) if ttl_s > 0 else None
        view = memoryview(entry)  # chunks without copies (redis-py sends memoryviews as is)
        try:
            old = self._client.getrange(name, 0, _MANIFEST.size)
            pipe = self._client.pipeline(transaction=True)
            for i, cname in enumerate(self._chunk_names(name, gen, n)):
                pipe.set(cname, view[i * self.chunk_bytes : (i + 1) * self.chunk_bytes], px=px)
            pipe.set(name, manifest, px=px)
            if len(old) == _MANIFEST.size:
                magic, _, old_n, _, old_gen = _MANIFEST.unpack(old)
                if magic == _MANIFEST_MAGIC and old_gen != gen and 0 < old_n <= 1 << 20:
                    pipe.delete(*self._chunk_names(name, old_gen, old_n))
            pipe.execute()
        except self._errors as exc:
            raise FleetUnavailable(f"{type(exc).__name__}: {exc}") from None

    def delete(self, key: FleetKey) -> bool:
        """Remove the entry (manifest and chunks); whether there was one."""
        name = self._name(key)
        try:
            old = self._client.getrange(name, 0, _MANIFEST.size)
            if len(old) != _MANIFEST.size:
                return bool(self._client.delete(name))
            _, _, n, _, gen = _MANIFEST.unpack(old)
            names = [name, *self._chunk_names(name, gen, min(n, 1 << 20))]
            return bool(self._client.delete(*names))
        except self._errors as exc:
            raise FleetUnavailable(f"{type(exc).__name__}: {exc}") from None

    def ping(self) -> None:
        try:
            self._client.ping()
        except self._errors as exc:
            raise FleetUnavailable(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._client.close()


__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_PREFIX", "FleetStore", "FleetUnavailable"]

"""The fleet cache tier as a driver sees it: on a local miss, a signed artifact from Redis.

The driver host calls :meth:`FleetTier.lookup` when an app's prepare found no
valid local cache (so it sent the model for a full compile), after its grant
checked out. A verified artifact is then loaded like a local cache hit and
saved through the normal local path (the app's cache files, the driver's
verified map), so the next start is a local hit. Anything else is a miss and
the driver compiles as it would have: an unreachable store, no entry, or an
entry refused (reason logged once per entry; see :mod:`npumanager.cache.fleet`).

Builders use :func:`build_entry` (``npu cache publish``): the same key
function, on the same plugin, so what a builder publishes is what a node of
the same make asks for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npumanager.cache.fleet import (
    Artifact,
    FleetKey,
    FleetRefused,
    SigningKey,
    TrustedKeys,
    cpu_features,
    open_entry,
    seal_entry,
)
from npumanager.drivers.base import CompileOptions, Driver, PreparedModel
from npumanager.errors import InvalidArgument

log = logging.getLogger("npumanager.drivers.fleet")

_LOGGED = 1024  # refusals remembered so each bad entry is logged once


@dataclass(frozen=True)
class FleetConfig:
    """The [fleet] section of the config (see npumanager/defaults.toml)."""

    redis_url: str = ""
    trusted_keys: tuple[str, ...] = ()
    signing_key: str = ""
    key_prefix: str = "npu:fleet:v1:"
    connect_timeout_s: float = 0.5
    timeout_s: float = 5.0
    max_entry_bytes: int = 4 << 30
    chunk_bytes: int = 64 << 20
    ttl_s: float = 0.0

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> FleetConfig:
        s = dict(section or {})
        keys = s.get("trusted_keys", [])
        if isinstance(keys, str) or not isinstance(keys, list | tuple):
            raise InvalidArgument("[fleet] trusted_keys is a list of key files or "
                                  "'ed25519:BASE64' strings")
        cfg = cls(
            redis_url=str(s.get("redis_url", "")),
            trusted_keys=tuple(str(k) for k in keys),
            signing_key=str(s.get("signing_key", "")),
            key_prefix=str(s.get("key_prefix", cls.key_prefix)),
            connect_timeout_s=float(s.get("connect_timeout_s", cls.connect_timeout_s)),
            timeout_s=float(s.get("timeout_s", cls.timeout_s)),
            max_entry_bytes=int(s.get("max_entry_bytes", cls.max_entry_bytes)),
            chunk_bytes=int(s.get("chunk_bytes", cls.chunk_bytes)),
            ttl_s=float(s.get("ttl_s", cls.ttl_s)),
        )
        if cfg.connect_timeout_s <= 0 or cfg.timeout_s <= 0:
            raise InvalidArgument("[fleet] timeouts must be positive")
        if cfg.max_entry_bytes < 1 or cfg.chunk_bytes < 1:
            raise InvalidArgument("[fleet] max_entry_bytes and chunk_bytes must be positive")
        return cfg

    @property
    def enabled(self) -> bool:
        """A node uses the tier once it has a store and at least one key to trust."""
        return bool(self.redis_url and self.trusted_keys)

    def store(self) -> Any:
        from npumanager.cache.fleet_store import FleetStore

        return FleetStore(self.redis_url, prefix=self.key_prefix,
                          connect_timeout_s=self.connect_timeout_s, timeout_s=self.timeout_s,
                          max_entry_bytes=self.max_entry_bytes, chunk_bytes=self.chunk_bytes)


def driver_identity(driver: Driver) -> tuple[str, str, str]:
    """(backend, backend version, device) of a driver, as fleet keys name them.

    A plugin that knows its device better (an NPU's stepping, a GPU's compute
    capability) provides ``fleet_device()``; otherwise the backend string it
    reports plus the CPU's vector extensions."""
    backend = str(getattr(type(driver), "name", "") or type(driver).__name__)
    hook = getattr(driver, "fleet_device", None)
    device = str(hook()) if callable(hook) else f"{driver.capabilities().backend}|{cpu_features()}"
    return backend, str(driver.version), device


def fleet_key(identity: tuple[str, str, str], model: bytes, options: CompileOptions,
              counts: tuple[int, int]) -> FleetKey:
    backend, version, device = identity
    return FleetKey.for_model(backend, version, device, model, {
        "preference": options.preference, "priority": options.priority,
        "model_cache_files": counts[0], "data_cache_files": counts[1],
    })


def build_entry(driver: Driver, counts: tuple[int, int], model: bytes, options: CompileOptions,
                signer: SigningKey) -> tuple[FleetKey, bytes, float]:
    """Compile ``model`` with ``driver`` and seal its cache artifacts; (key, entry, compile s)."""
    compile_fn = getattr(driver, "compile_with_artifacts", None) or driver.compile
    t0 = time.perf_counter()
    prepared = compile_fn(model, options)
    try:
        model_blobs, data_blobs = prepared.artifacts()
    finally:
        prepared.release()
    seconds = time.perf_counter() - t0
    if (len(model_blobs), len(data_blobs)) != counts:
        raise InvalidArgument(f"the driver produced {len(model_blobs)} model and "
                              f"{len(data_blobs)} data blobs, not {counts[0]} and {counts[1]}")
    key = fleet_key(driver_identity(driver), model, options, counts)
    return key, seal_entry(key, model_blobs, data_blobs, signer), seconds


class FleetTier:
    """One driver's view of the fleet store. ``lookup`` blocks (run it off the event loop)."""

    def __init__(self, cfg: FleetConfig, driver: Driver, counts: tuple[int, int],
                 *, store: Any = None, trusted: TrustedKeys | None = None) -> None:
        self.cfg = cfg
        self.driver = driver
        self.counts = counts
        self.identity = driver_identity(driver)
        self.trusted = trusted if trusted is not None else TrustedKeys.load(cfg.trusted_keys)
        self.store = store if store is not None else cfg.store()
        self.stats = {"hit": 0, "miss": 0, "refused": 0, "unavailable": 0}
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()
        self._store_down = False

    def __repr__(self) -> str:
        s = self.stats
        return (f"<FleetTier {self.identity[0]} {self.store!r}: {s['hit']} hits, "
                f"{s['miss']} misses, {s['refused']} refused, {s['unavailable']} unavailable>")

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    def _log_once(self, digest: str, reason: str, level: int, msg: str) -> None:
        with self._lock:
            if (digest, reason) in self._logged:
                return
            self._logged[(digest, reason)] = None
            if len(self._logged) > _LOGGED:
                self._logged.popitem(last=False)
        log.log(level, msg)

    def lookup(self, model: bytes, options: CompileOptions) -> Artifact | None:
        """The verified artifact for this model and these options, or None (a miss)."""
        from npumanager.cache.fleet_store import FleetUnavailable

        key = fleet_key(self.identity, model, options, self.counts)
        try:
            data = self.store.get(key)
        except FleetUnavailable as exc:
            self._count("unavailable")
            with self._lock:
                first, self._store_down = not self._store_down, True
            if first:  # once per outage, not once per prepare
                log.warning("fleet cache %s unavailable (%s); compiling locally until it "
                            "answers", self.cfg.redis_url, exc)
            return None
        except FleetRefused as exc:
            self._refused(key, exc.reason)
            return None
        with self._lock:
            back, self._store_down = self._store_down, False
        if back:
            log.info("fleet cache %s answers again", self.cfg.redis_url)
        if data is None:
            self._count("miss")
            return None
        try:
            art = open_entry(data, key, self.trusted)
        except FleetRefused as exc:
            self._refused(key, exc.reason)
            return None
        if (len(art.model_blobs), len(art.data_blobs)) != self.counts:
            self._refused(key, f"{len(art.model_blobs)}+{len(art.data_blobs)} blobs for "
                               f"{self.counts[0]}+{self.counts[1]} cache files")
            return None
        self._count("hit")
        log.info("fleet cache hit for %s (%d bytes, signed by %s on %s)", key.describe(),
                 art.nbytes, art.key_id, art.builder or "?")
        return art

    def prepare(self, model: bytes, options: CompileOptions
                ) -> tuple[PreparedModel, Artifact] | None:
        """A model loaded from the fleet's verified artifact (and the artifact, for the
        local save), or None: compile as usual. Blocks; never raises."""
        art = self.lookup(model, options)
        if art is None:
            return None
        try:
            prepared = self.driver.load_artifacts(art.model_blobs, art.data_blobs, options)
        except Exception as exc:  # signed, yet this backend cannot load it: a miss
            self._refused(art.key, f"the backend cannot load it: {exc}")
            return None
        return prepared, art

    def _refused(self, key: FleetKey, reason: str) -> None:
        self._count("refused")
        self._log_once(key.digest(), reason, logging.WARNING,
                       f"fleet cache entry for {key.describe()} refused: {reason}; "
                       "compiling locally")

    def close(self) -> None:
        self.store.close()


def open_tier(section: Mapping[str, Any] | None, driver: Driver, counts: tuple[int, int]
              ) -> FleetTier | None:
    """The tier a driver host uses, or None (off, no caching, or misconfigured: logged)."""
    try:
        cfg = FleetConfig.from_section(section)
        if not cfg.enabled or counts[0] < 1:
            return None
        return FleetTier(cfg, driver, counts)
    except InvalidArgument as exc:
        log.error("fleet cache tier disabled: %s", exc)
        return None


__all__ = [
    "FleetConfig",
    "FleetTier",
    "build_entry",
    "driver_identity",
    "fleet_key",
    "open_tier",
]

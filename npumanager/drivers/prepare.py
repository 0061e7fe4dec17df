"""prepare_model and prepare_model_from_cache for the driver host.

Enforced admission: a prepare needs a live grant of the caller's uid. npud
tells the driver about a grant before it tells the client, but the two
sockets race, so an unknown grant is waited for briefly (``grant_wait_s``)
before the prepare is refused with GrantRequired. Compilation and cache I/O
run off the event loop. Caching follows NNAPI: a failure to save never
changes the prepare result; a load verifies the in-memory buffers against the
driver's private map before anything is deserialized.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from npumanager.drivers.base import CompileOptions, PreparedModel, check_prepared_model
from npumanager.errors import (
    DriverRefused,
    GeneralFailure,
    GrantRequired,
    GrantRevoked,
    InvalidArgument,
)
from npumanager.fds import close_fds
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.wire.conn import CallContext

if TYPE_CHECKING:
    from npumanager.drivers.host import DriverHost, Grant

log = logging.getLogger("npumanager.drivers.prepare")


def _specs(infos: list[Any]) -> list[pb.TensorSpec]:
    return [pb.TensorSpec(name=i.name, dtype=i.dtype, shape=list(i.shape)) for i in infos]


def _read_memfd(fd: int, size: int, limit: int) -> bytes:
    if size > limit:
        raise InvalidArgument(f"model of {size} bytes exceeds the driver's limit of {limit}")
    chunks = []
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(size - pos, 16 << 20), pos)
        if not chunk:
            raise InvalidArgument(f"the model memfd holds {pos} bytes, not {size}")
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


class Preparer:
    def __init__(self, host: DriverHost) -> None:
        self.host = host
        self._cache: Any = None  # DriverCache, created on the cache thread when first used

    def close(self) -> None:
        if self._cache is not None:
            cache, self._cache = self._cache, None
            self.host.cache_pool.submit(cache.close).result()

    # --- grants ---------------------------------------------------------------------

    async def check_grant(self, ctx: CallContext, grant_id: str) -> Grant | None:
        host = self.host
        uid = ctx.peer.uid
        if not host.hc.enforce_admission:
            g = host.grants.get(grant_id) if grant_id else None
            return g if g is not None and g.uid == uid else None
        if not grant_id:
            raise GrantRequired(
                f"driver {host.hc.name} admits models only with a grant: ask npud first "
                "(NpuManager.request_can_load_model) and pass grant=listener"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + host.hc.grant_wait_s
        while True:
            g = host.grants.get(grant_id)
            if g is not None:
                if g.uid != uid:
                    raise GrantRequired(f"that grant was not issued to uid {uid}")
                return g
            if grant_id in host.ended_grants:
                raise GrantRevoked(f"grant {grant_id[:8]}… has already ended")
            remaining = deadline - loop.time()
            event = host._grant_event
            if remaining <= 0 or event is None:
                raise GrantRequired(
                    f"driver {host.hc.name} does not know grant {grant_id[:8]}… (not issued by "
                    "npud, or already ended)"
                )
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass

    def _still_live(self, grant: Grant | None, prepared: PreparedModel) -> None:
        if grant is not None and grant.grant_id not in self.host.grants:
            prepared.release()
            raise GrantRevoked(f"grant {grant.grant_id[:8]}… ended while the model was prepared")

    # --- cache --------------------------------------------------------------------

    def _driver_cache(self) -> Any:
        """The DriverCache (runs on the single cache thread: SQLite stays on one thread)."""
        if self._cache is None:
            try:
                from npumanager.drivers.cache_store import DriverCache
            except ImportError:
                raise GeneralFailure("caching not supported by this build") from None
            host = self.host
            n_model, n_data = host.cache_counts
            self._cache = DriverCache(
                host.hc.name, str(host.driver.version), n_model, n_data,
                state_root=host.state_dir, max_entries=host.hc.cache_max_entries,
                max_bytes=host.hc.max_model_bytes,
            )
        return self._cache

    def _save(self, prepared: PreparedModel, token: bytes, model_fds: list[int],
              data_fds: list[int]) -> bool:
        try:
            model_blobs, data_blobs = prepared.artifacts()
            saved: bool = self._driver_cache().save(
                token, model_fds, data_fds, model_blobs, data_blobs
            )
            return saved
        except Exception as exc:  # NNAPI: a failed save never changes the prepare result
            log.warning("%s: compilation cache not saved: %s", self.host.hc.name, exc)
            return False

    def _attach_rewriter(self, prepared: PreparedModel, token: bytes, model_fds: list[int],
                         data_fds: list[int]) -> None:
        """JIT / multi-stage models rewrite the cache later (cache engineer's drivers/staged.py):
        hand them dups of the cache fds and a save that runs on the cache thread."""
        attach = getattr(prepared, "attach_cache", None)
        if attach is None:
            return
        from npumanager.drivers.staged import CacheRewriter

        pool = self.host.cache_pool

        def save(tok: bytes, m: list[int], d: list[int], mb: list[bytes], db: list[bytes]) -> bool:
            ok: bool = pool.submit(lambda: self._driver_cache().save(tok, m, d, mb, db)).result()
            return ok

        try:
            attach(CacheRewriter(save, token, model_fds, data_fds))
        except Exception as exc:  # caching is best effort
            log.warning("%s: cache rewrites disabled: %s", self.host.hc.name, exc)

    def _load(self, token: bytes, model_fds: list[int], data_fds: list[int]
              ) -> tuple[list[bytes], list[bytes]]:
        bufs: tuple[list[bytes], list[bytes]] = self._driver_cache().load(
            token, model_fds, data_fds
        )
        return bufs

    # --- handlers ------------------------------------------------------------------

    def _reply(self, ctx: CallContext, prepared: PreparedModel, grant: Grant | None,
               *, from_cache: bool, written: bool) -> pb.PreparedModelMsg:
        entry = self.host.add_model(ctx.conn, prepared, grant)
        if from_cache or written:  # a compile that filled the cache was a miss
            self._cache_result(b"hit" if from_cache else b"miss")
        return pb.PreparedModelMsg(
            model_id=entry.model_id, memory_bytes=prepared.memory_bytes,
            inputs=_specs(prepared.inputs), outputs=_specs(prepared.outputs),
            from_cache=from_cache, cache_written=written,
        )

    async def prepare_model(self, ctx: CallContext, payload: bytes) -> pb.PreparedModelMsg:
        fds, ctx.fds = ctx.fds, []
        try:
            return await self._prepare_model(ctx, payload, fds)
        finally:
            close_fds(fds)

    async def _prepare_model(self, ctx: CallContext, payload: bytes, fds: list[int]
                             ) -> pb.PreparedModelMsg:
        host = self.host
        msg = pb.PrepareModel.FromString(payload)
        n_cache = msg.n_model_cache + msg.n_data_cache
        if len(fds) != n_cache + (1 if msg.onnx_in_memfd else 0):
            raise InvalidArgument(
                f"prepare_model announced {n_cache} cache fds"
                f"{' and a model memfd' if msg.onnx_in_memfd else ''}; {len(fds)} fds arrived"
            )
        if msg.token and len(msg.token) != 32:
            raise InvalidArgument(f"a cache token has 32 bytes, not {len(msg.token)}")
        caching = bool(msg.token) and n_cache > 0
        if caching and (msg.n_model_cache, msg.n_data_cache) != host.cache_counts:
            raise InvalidArgument(
                f"driver {host.hc.name} needs {host.cache_counts[0]} model and "
                f"{host.cache_counts[1]} data cache files, got {msg.n_model_cache} and "
                f"{msg.n_data_cache}"
            )
        grant = await self.check_grant(ctx, msg.grant_id)
        loop = asyncio.get_running_loop()
        if msg.onnx_in_memfd:
            onnx = await loop.run_in_executor(
                host.compile_pool, _read_memfd, fds[-1], msg.onnx_size, host.hc.max_model_bytes
            )
        else:
            onnx = msg.onnx
        if not onnx:
            raise InvalidArgument("prepare_model needs the model's ONNX bytes")
        opts = CompileOptions(preference=msg.preference, priority=msg.priority or 100)
        # A driver may produce its cache artifacts in the same compile (optional hook).
        compile_fn = getattr(host.driver, "compile_with_artifacts", None) if caching else None
        prepared = await loop.run_in_executor(
            host.compile_pool, compile_fn or host.driver.compile, onnx, opts
        )
        try:
            check_prepared_model(host.hc.name, prepared)
        except DriverRefused as exc:
            raise GeneralFailure(str(exc)) from None
        self._still_live(grant, prepared)
        written = False
        if caching:
            model_fds = fds[: msg.n_model_cache]
            data_fds = fds[msg.n_model_cache : n_cache]
            written = await loop.run_in_executor(
                host.cache_pool, self._save, prepared, bytes(msg.token), model_fds, data_fds
            )
            self._attach_rewriter(prepared, bytes(msg.token), model_fds, data_fds)
            self._still_live(grant, prepared)
        return self._reply(ctx, prepared, grant, from_cache=False, written=written)

    async def prepare_model_from_cache(self, ctx: CallContext, payload: bytes
                                       ) -> pb.PreparedModelMsg:
        fds, ctx.fds = ctx.fds, []
        try:
            return await self._prepare_from_cache(ctx, payload, fds)
        except (GeneralFailure, InvalidArgument):
            self._cache_result(b"rejected")  # the client falls back to a full compile
            raise
        finally:
            close_fds(fds)

    def _cache_result(self, result: bytes) -> None:
        """Tell npud how a cache load went (its npu_cache_loads_total metric)."""
        conn = self.host.manager_conn
        if conn is not None:
            conn.push("hal.cache_result", result)

    async def _prepare_from_cache(self, ctx: CallContext, payload: bytes, fds: list[int]
                                  ) -> pb.PreparedModelMsg:
        host = self.host
        msg = pb.PrepareModelFromCache.FromString(payload)
        if host.cache_counts == (0, 0):
            raise GeneralFailure(f"driver {host.hc.name} does not support compilation caching")
        if len(fds) != msg.n_model_cache + msg.n_data_cache:
            raise InvalidArgument(
                f"prepare_model_from_cache announced {msg.n_model_cache + msg.n_data_cache} "
                f"fds; {len(fds)} arrived"
            )
        grant = await self.check_grant(ctx, msg.grant_id)
        loop = asyncio.get_running_loop()
        model_fds, data_fds = fds[: msg.n_model_cache], fds[msg.n_model_cache :]
        model_bufs, data_bufs = await loop.run_in_executor(
            host.cache_pool, self._load, bytes(msg.token), model_fds, data_fds
        )
        opts = CompileOptions(preference=msg.preference, priority=msg.priority or 100)
        try:
            prepared = await loop.run_in_executor(
                host.compile_pool, host.driver.load_artifacts, model_bufs, data_bufs, opts
            )
        except (GeneralFailure, InvalidArgument):
            raise
        except NotImplementedError as exc:
            raise GeneralFailure(f"caching not supported: {exc}") from None
        except Exception as exc:
            raise GeneralFailure(f"the verified cache could not be loaded: {exc}") from None
        self._still_live(grant, prepared)
        return self._reply(ctx, prepared, grant, from_cache=True, written=False)

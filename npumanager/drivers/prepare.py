"""Compiling models and NNAPI compilation caching for the driver host.

:class:`Preparer` turns a prepare request into a :class:`PreparedModel`:
``prepare_model`` compiles (reading a large model from a memfd) and writes the
cache files when asked; ``prepare_model_from_cache`` reads every cache file
once into memory, verifies the buffers against the driver's private map
(:class:`~npumanager.drivers.cache_store.DriverCache`) and only then
deserializes. Compilation and cache I/O run off the event loop; SQLite stays
on one thread. As in NNAPI, a failure to save never changes the prepare
result. Admission (grants) is the host's business, decided by its state.

``background_load``: a BACKGROUND model's session is built from compiled artifacts (the
compile child's, a cache entry's) on the lowered compile pool by default. On normal-priority
threads of its own instead (``"normal"``, bench variant bg-load-normal), a preempted
lowered thread could never hold the GIL or the process's memory map lock across the
host's 45-95 ms of native loading work; measured, it bought nothing: three quick same-run
pairs, camera p99 while a model loads lowered / normal 4.3 / 5.8, 5.9 / 5.0, 4.3 / 5.2 ms
(contended 1.6 / 2.5, 1.7 / 3.5, 1.5 / 2.5), the load's p50 370 / 343, 343 / 320, 386 /
359 ms. A kernel trace of the loading phase (bench/contention_trace.py, its stage table)
puts the slow frames behind the step workers (npu-bg_N) in every stage of the load, not
behind the loading thread, so it stays lowered.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from npumanager.drivers.base import CompileOptions, Driver, PreparedModel, check_prepared_model
from npumanager.drivers.bg_threads import background_pool, pin_this_thread
from npumanager.drivers.cache_store import DriverCache
from npumanager.drivers.classes import load_policy
from npumanager.drivers.compile_starve import CompileRaiser
from npumanager.drivers.compile_watch import CompileWatch
from npumanager.drivers.compile_worker import CompileWorker
from npumanager.drivers.external_data import bind, sent_files
from npumanager.drivers.fleet_tier import open_tier
from npumanager.drivers.load_place import LoadPlace
from npumanager.drivers.staged import CacheRewriter
from npumanager.errors import DriverRefused, GeneralFailure, InvalidArgument
from npumanager.hal.host_config import HostConfig
from npumanager.hal.idle_cgroup import COMPILE, IdleGroup
from npumanager.proto.v1 import driver_pb2 as pb

log = logging.getLogger("npumanager.drivers.prepare")

T = TypeVar("T")


@dataclass
class Prepared:
    model: PreparedModel
    from_cache: bool
    cache_written: bool
    #: Loaded from a verified fleet cache artifact after a local miss (drivers/fleet_tier.py).
    from_fleet: bool = False


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
    def __init__(self, hc: HostConfig, driver: Driver, cache_counts: tuple[int, int],
                 state_dir: Path) -> None:
        if hc.background_compile not in ("process", "thread"):
            raise ValueError(f"background_compile must be 'process' or 'thread', not "
                             f"{hc.background_compile!r}")
        if hc.background_load not in ("lowered", "normal"):
            raise ValueError(f"background_load must be 'lowered' or 'normal', not "
                             f"{hc.background_load!r}")
        self.hc = hc
        self.driver = driver
        self.cache_counts = cache_counts
        self.state_dir = state_dir
        self.compile_pool = ThreadPoolExecutor(2, thread_name_prefix=f"npu-{hc.name}-compile")
        #: A background model compiles on lowered threads (bg_threads.lower_this_thread): loading
        #: it must not take the core from foreground work; ONNX Runtime's intra-op threads,
        #: created by the compiling thread, inherit that too.
        self.bg_compile_pool = self.compile_pool
        # The load's policy (fair share among background apps is for their steps: compiles
        # stay idle), or ``background_load_nice``'s nice value instead of SCHED_IDLE.
        sched, nice = load_policy(hc.background_sched, hc.background_nice,
                                  hc.background_load_nice)
        #: Where a background load's work runs (``load_cpus``: .load_place), and the
        #: foreground's burst threads meanwhile.
        self.place = LoadPlace(hc.load_cpus)
        self.load_cpus = self.place.load_cpus
        #: The cpu.idle cgroup npud made for this host's background threads (none: "").
        self.idle_group = IdleGroup(hc.background_cgroup_dir, hc.background_sched)
        #: The group for the load's threads: none where the load runs at a nice value (the
        #: group would make it idle again, and the host cannot take a thread out).
        load_group = self.idle_group if sched == "idle" else None
        if sched != "normal":
            self.bg_compile_pool = background_pool(2, f"npu-{hc.name}-bgcompile",
                                                   sched, nice,
                                                   cpus=self.load_cpus,
                                                   group=load_group, kind=COMPILE,
                                                   lower=hc.background_lower,
                                                   slice_us=hc.background_slice_us)
        #: Where the host builds a BACKGROUND model's session from compiled artifacts (the
        #: compile child's, the cache's): the lowered pool, or (``background_load =
        #: "normal"``) threads of its own at normal priority.
        self.bg_load_pool = self.bg_compile_pool
        if hc.background_load == "normal":
            self.bg_load_pool = ThreadPoolExecutor(2, thread_name_prefix=f"npu-{hc.name}-bgload",
                                                   initializer=pin_this_thread,
                                                   initargs=(self.load_cpus,))
        #: BACKGROUND models a driver can compile elsewhere (``compile_in_worker``) compile
        #: in a lowered child process, off this process's GIL (drivers/compile_worker.py).
        self.worker: CompileWorker | None = None
        #: How a starved background compile is raised: by this host where RLIMIT_NICE
        #: allows, by npud on its request otherwise (.compile_starve; the host sets
        #: ``raiser.ask`` once it has its link to npud).
        self.raiser = CompileRaiser(hc.name)
        if hc.compile_raise not in ("npud", "self"):
            raise ValueError(f"compile_raise must be 'npud' or 'self', not "
                             f"{hc.compile_raise!r}")
        #: ``compile_raise = "npud"``: npud's raise and the in-host watch (opt-in; "self":
        #: neither, as before).
        self.via_npud = hc.compile_raise == "npud"
        #: The same bound for BACKGROUND compiles run on this process's lowered threads
        #: (.compile_watch): only at SCHED_IDLE, and not in the idle cgroup (a raised
        #: thread would stay idle in it, and the host cannot take it out).
        self.watch: CompileWatch | None = None
        if (self.via_npud and sched == "idle" and hc.background_starve_ms > 0
                and self.idle_group.path is None and self.bg_compile_pool is not self.compile_pool):
            self.watch = CompileWatch(hc.name, hc.background_starve_ms, self.raiser)
        self._worker_hook: Callable[..., PreparedModel | None] | None = getattr(
            driver, "compile_in_worker", None)
        if hc.background_compile == "process" and self._worker_hook is not None:
            self.worker = CompileWorker(hc.name, sched, nice,
                                        hc.background_starve_ms, load_group,
                                        hc.malloc_mmap_threshold_kb, hc.background_slice_us,
                                        hc.compile_malloc, self.load_cpus,
                                        self.raiser if self.via_npud else None)
        self.cache_pool = ThreadPoolExecutor(1, thread_name_prefix=f"npu-{hc.name}-cache")
        self._cache: DriverCache | None = None  # created on the cache thread when first used
        # The fleet tier, opened now so a bad [fleet] is logged at start and the first
        # prepare pays no imports; None when off.
        self.fleet = open_tier(hc.fleet, driver, cache_counts)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.kill()  # before the pools' waits: a compile under way ends now
        self.compile_pool.shutdown(wait=True, cancel_futures=True)
        if self.bg_compile_pool is not self.compile_pool:
            self.bg_compile_pool.shutdown(wait=True, cancel_futures=True)
        if self.bg_load_pool is not self.bg_compile_pool:
            self.bg_load_pool.shutdown(wait=True, cancel_futures=True)
        if self.worker is not None:
            self.worker.close()
        if self.watch is not None:
            self.watch.close()
        if self.fleet is not None:
            self.fleet.close()
        if self._cache is not None:
            cache, self._cache = self._cache, None
            self.cache_pool.submit(cache.close).result()
        self.cache_pool.shutdown(wait=True, cancel_futures=True)

    # --- checks before admission --------------------------------------------------

    def check_prepare(self, msg: pb.PrepareModel, fds: list[int]) -> None:
        n_cache = msg.n_model_cache + msg.n_data_cache
        n_ext = len(msg.external_locations)
        if len(fds) != n_cache + (1 if msg.onnx_in_memfd else 0) + n_ext:
            raise InvalidArgument(
                f"prepare_model announced {n_cache} cache fds"
                f"{', a model memfd' if msg.onnx_in_memfd else ''} and {n_ext} external data "
                f"files; {len(fds)} fds arrived"
            )
        if msg.token and len(msg.token) != 32:
            raise InvalidArgument(f"a cache token has 32 bytes, not {len(msg.token)}")
        if self._caching(msg) and (msg.n_model_cache, msg.n_data_cache) != self.cache_counts:
            raise InvalidArgument(
                f"driver {self.hc.name} needs {self.cache_counts[0]} model and "
                f"{self.cache_counts[1]} data cache files, got {msg.n_model_cache} and "
                f"{msg.n_data_cache}"
            )

    def check_from_cache(self, msg: pb.PrepareModelFromCache, fds: list[int]) -> None:
        if self.cache_counts == (0, 0):
            raise GeneralFailure(f"driver {self.hc.name} does not support compilation caching")
        if len(fds) != msg.n_model_cache + msg.n_data_cache:
            raise InvalidArgument(
                f"prepare_model_from_cache announced {msg.n_model_cache + msg.n_data_cache} "
                f"fds; {len(fds)} arrived"
            )

    @staticmethod
    def _caching(msg: pb.PrepareModel) -> bool:
        return bool(msg.token) and msg.n_model_cache + msg.n_data_cache > 0

    # --- prepare ------------------------------------------------------------------

    async def prepare_model(self, msg: pb.PrepareModel, fds: list[int], uid: int, *,
                            background: bool = False) -> Prepared:
        """Compile (after :meth:`check_prepare`); write the cache files when asked, as an
        entry of ``uid`` (the caller's kernel-verified uid). ``background``: the model's
        execution class is BACKGROUND (compiled on a background thread)."""
        if not background:
            return await self._prepare_model(msg, fds, uid, background=False)
        with self.place.loading():
            return await self._prepare_model(msg, fds, uid, background=True)

    async def _prepare_model(self, msg: pb.PrepareModel, fds: list[int], uid: int, *,
                             background: bool) -> Prepared:
        loop = asyncio.get_running_loop()
        pool = self.bg_compile_pool if background else self.compile_pool
        n_cache = msg.n_model_cache + msg.n_data_cache
        n_memfd = 1 if msg.onnx_in_memfd else 0
        files = sent_files(list(msg.external_locations), fds[n_cache + n_memfd :])
        caching = self._caching(msg)
        if background and self.worker is not None and not files and self.fleet is None:
            # The worker reads, checks and compiles the model; nothing of it runs on this
            # process's GIL (drivers/compile_worker.py). The client's memfd goes on as is.
            if msg.onnx_in_memfd and msg.onnx_size > self.hc.max_model_bytes:
                raise InvalidArgument(f"model of {msg.onnx_size} bytes exceeds the driver's "
                                      f"limit of {self.hc.max_model_bytes}")
            source: bytes | tuple[int, int] = (
                (fds[n_cache], msg.onnx_size) if msg.onnx_in_memfd else msg.onnx)
            if not msg.onnx_in_memfd and not source:
                raise InvalidArgument("prepare_model needs the model's ONNX bytes")
            opts = CompileOptions(preference=msg.preference, priority=msg.priority or 100,
                                  background=True)
            worker, hook = self.worker, self._worker_hook
            assert hook is not None
            # (The thread waits for the child, then builds the session from its artifacts.)
            def in_worker() -> PreparedModel | None:
                return hook(worker, source, opts, caching, self.hc.max_model_bytes)

            prepared = await loop.run_in_executor(self.bg_load_pool, self._watched, in_worker)
            if prepared is not None:
                return await self._finish(prepared, msg, fds, uid, caching)
        if msg.onnx_in_memfd:
            onnx = await loop.run_in_executor(
                self.compile_pool, _read_memfd, fds[n_cache], msg.onnx_size,
                self.hc.max_model_bytes)
        else:
            onnx = msg.onnx
        if not onnx:
            raise InvalidArgument("prepare_model needs the model's ONNX bytes")
        # Every external-data reference resolved against the files the client sent, and
        # nothing else (the driver never opens a path an app named).
        onnx, external = await loop.run_in_executor(
            self.compile_pool, lambda: bind(
                onnx, files, max_bytes=self.hc.max_model_bytes,
                accepts=type(self.driver).accepts_external_data, driver=self.hc.name))
        opts = CompileOptions(preference=msg.preference, priority=msg.priority or 100,
                              external_data=external, background=background)
        # The local cache missed: a builder may have published it. Not for a model with
        # external data: the fleet key hashes the model bytes, which do not cover it.
        if self.fleet is not None and not external:
            hit = await loop.run_in_executor(pool, self.fleet.prepare, onnx, opts)
            if hit is not None:
                n = msg.n_model_cache
                written = caching and await loop.run_in_executor(
                    self.cache_pool, self._save_blobs, bytes(msg.token), fds[:n],
                    fds[n:n + msg.n_data_cache], hit[1].model_blobs, hit[1].data_blobs, uid)
                return Prepared(hit[0], from_cache=True, cache_written=written, from_fleet=True)
        # A driver may produce its cache artifacts in the same compile (optional hook).
        compile_fn = getattr(self.driver, "compile_with_artifacts", None) if caching else None
        fn = compile_fn or self.driver.compile
        if background and self.watch is not None:  # (on the lowered pool: bounded)
            compiled = await loop.run_in_executor(pool, self.watch.run, fn, onnx, opts)
        else:
            compiled = await loop.run_in_executor(pool, fn, onnx, opts)
        return await self._finish(compiled, msg, fds, uid, caching)

    def _watched(self, fn: Callable[[], T]) -> T:
        """(on the background load pool) ``fn()``, its thread alone under the starvation
        bound where that pool is lowered (.compile_watch): a session built from artifacts
        at SCHED_IDLE, pinned to a CPU kept busy, waited there without end (seen: the
        compile child raised, the prepare still hung after it)."""
        if self.watch is None or self.bg_load_pool is not self.bg_compile_pool:
            return fn()
        return self.watch.run_here(fn)

    async def _finish(self, prepared: PreparedModel, msg: pb.PrepareModel, fds: list[int],
                      uid: int, caching: bool) -> Prepared:
        """Check what the driver compiled; write the cache files when asked."""
        loop = asyncio.get_running_loop()
        try:
            check_prepared_model(self.hc.name, prepared)
        except DriverRefused as exc:
            raise GeneralFailure(str(exc)) from None
        written = False
        if caching:
            n_model = msg.n_model_cache
            model_fds, data_fds = fds[:n_model], fds[n_model:n_model + msg.n_data_cache]
            token = bytes(msg.token)
            written = await loop.run_in_executor(
                self.cache_pool, self._save, prepared, token, model_fds, data_fds, uid)
            self._attach_rewriter(prepared, token, model_fds, data_fds, uid)
        return Prepared(prepared, from_cache=False, cache_written=written)

    async def prepare_from_cache(self, msg: pb.PrepareModelFromCache, fds: list[int],
                                 uid: int, *, background: bool = False) -> Prepared:
        """Load cache files verified against ``uid``'s entry (after
        :meth:`check_from_cache`)."""
        if not background:
            return await self._from_cache(msg, fds, uid, background=False)
        with self.place.loading():
            return await self._from_cache(msg, fds, uid, background=True)

    async def _from_cache(self, msg: pb.PrepareModelFromCache, fds: list[int], uid: int, *,
                          background: bool) -> Prepared:
        loop = asyncio.get_running_loop()
        model_fds, data_fds = fds[: msg.n_model_cache], fds[msg.n_model_cache :]
        model_bufs, data_bufs = await loop.run_in_executor(
            self.cache_pool, self._load, bytes(msg.token), model_fds, data_fds, uid)
        opts = CompileOptions(preference=msg.preference, priority=msg.priority or 100,
                              background=background)
        pool = self.bg_load_pool if background else self.compile_pool
        load = self.driver.load_artifacts
        try:
            if background:
                prepared = await loop.run_in_executor(
                    pool, self._watched, lambda: load(model_bufs, data_bufs, opts))
            else:
                prepared = await loop.run_in_executor(pool, load, model_bufs, data_bufs, opts)
        except (GeneralFailure, InvalidArgument):
            raise
        except NotImplementedError as exc:
            raise GeneralFailure(f"caching not supported: {exc}") from None
        except Exception as exc:
            raise GeneralFailure(f"the verified cache could not be loaded: {exc}") from None
        return Prepared(prepared, from_cache=True, cache_written=False)

    # --- cache (on the cache thread) ----------------------------------------------------

    def _driver_cache(self) -> DriverCache:
        if self._cache is None:
            n_model, n_data = self.cache_counts
            self._cache = DriverCache(
                self.hc.name, str(self.driver.version), n_model, n_data,
                state_root=self.state_dir, max_entries=self.hc.cache_max_entries,
                max_entries_per_uid=self.hc.cache_max_entries_per_uid,
                max_bytes=self.hc.max_model_bytes,
            )
        return self._cache

    def _save(self, prepared: PreparedModel, token: bytes, model_fds: list[int],
              data_fds: list[int], uid: int) -> bool:
        try:
            model_blobs, data_blobs = prepared.artifacts()
            return self._driver_cache().save(token, model_fds, data_fds, model_blobs,
                                             data_blobs, uid=uid)
        except Exception as exc:  # NNAPI: a failed save never changes the prepare result
            log.warning("%s: compilation cache not saved: %s", self.hc.name, exc)
            return False

    def _save_blobs(self, token: bytes, model_fds: list[int], data_fds: list[int],
                    model_blobs: list[bytes], data_blobs: list[bytes], uid: int) -> bool:
        """The normal local save, as ``uid``'s entry, of blobs that came from elsewhere (the
        fleet tier)."""
        try:
            return self._driver_cache().save(token, model_fds, data_fds, model_blobs,
                                             data_blobs, uid=uid)
        except Exception as exc:  # as in _save: a failed save never changes the result
            log.warning("%s: compilation cache not saved: %s", self.hc.name, exc)
            return False

    def _attach_rewriter(self, prepared: PreparedModel, token: bytes, model_fds: list[int],
                         data_fds: list[int], uid: int) -> None:
        """JIT / multi-stage models rewrite the cache later (drivers/staged.py): hand them
        dups of the cache fds and a save that runs on the cache thread."""
        attach = getattr(prepared, "attach_cache", None)
        if attach is None:
            return
        pool = self.cache_pool

        def save(tok: bytes, m: list[int], d: list[int], mb: list[bytes], db: list[bytes]) -> bool:
            return pool.submit(
                lambda: self._driver_cache().save(tok, m, d, mb, db, uid=uid)).result()

        try:
            attach(CacheRewriter(save, token, model_fds, data_fds))
        except Exception as exc:  # caching is best effort
            log.warning("%s: cache rewrites disabled: %s", self.hc.name, exc)

    def _load(self, token: bytes, model_fds: list[int], data_fds: list[int], uid: int
              ) -> tuple[list[bytes], list[bytes]]:
        return self._driver_cache().load(token, model_fds, data_fds, uid=uid)

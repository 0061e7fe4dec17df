"""The cache security suite: tampering with cache files never yields a crash or another model.

Any driver plugs in, as with the conformance suite: subclass
:class:`CacheSecuritySuite` and provide a class-scoped ``cache_backend``
fixture returning a :class:`CacheBackend` (how to make the driver, two models
with the same inputs and their independently computed outputs, the cache file
counts to use)::

    class TestMyDriverCache(CacheSecuritySuite):
        @pytest.fixture(scope="class")
        @classmethod
        def cache_backend(cls): return CacheBackend("mine", make_my_driver, ...)

Everything runs the exact driver-side code: DriverCache (fd I/O, keyed
verification, SQLite map) and the driver's ``artifacts``/``load_artifacts``.
Every case checks the outputs against the model's reference. The attacks:
flipped bits, appended and truncated bytes, emptied files, files swapped within
an entry, another model's files copied over, the same files under another
token, wrong fd counts and modes, stale offsets and sizes, a concurrent
rewriter, several processes at once, restarts and backend updates, and another
uid: its files (compiled under this app's token and swapped into its directory)
never load for this app, and its records never evict or replace this app's
entries (the map is keyed by (uid, token), with a per-uid share of its bound).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from npumanager.drivers.base import Driver, PreparedModel
from npumanager.drivers.cache_store import DriverCache
from npumanager.errors import InvalidArgument
from npumanager.fds import close_fds
from npumanager.nn.cache_files import open_cache_files
from npumanager.testing.backend_models import BuiltModel
from npumanager.testing.cache_flow import (
    APP_UID,
    OPTS,
    compile_and_save,
    entry_paths,
    prepare,
    try_load,
)

TA = bytes(range(32))
TB = bytes(range(1, 33))
#: Another app's uid (the suite's own app is cache_flow.APP_UID).
OTHER_UID = APP_UID + 1

DriverFactory = Callable[[dict[str, Any]], Driver]


@dataclass
class CacheBackend:
    """A driver to attack. ``make_driver`` must be a module-level function (the
    multi-process check pickles it); ``options`` are passed to it, and
    ``model_cache_files``/``data_cache_files`` set to ``counts`` where given."""

    name: str
    make_driver: DriverFactory
    model_a: BuiltModel
    model_b: BuiltModel
    options: dict[str, Any] = field(default_factory=dict)
    counts: tuple[int, int] | None = None

    def driver_options(self) -> dict[str, Any]:
        opts = dict(self.options)
        if self.counts is not None:
            opts["model_cache_files"], opts["data_cache_files"] = self.counts
        return opts


@dataclass
class Setup:
    backend: CacheBackend
    driver: Driver
    cache: DriverCache
    app: Path
    state: Path
    other_app: Path

    @property
    def a(self) -> BuiltModel:
        return self.backend.model_a

    @property
    def b(self) -> BuiltModel:
        return self.backend.model_b

    def paths(self, token: bytes = TA, app: Path | None = None) -> list[str]:
        model, data = entry_paths(self.cache, app or self.app, token)
        return model + data

    def prepare(self, model: BuiltModel | None = None, token: bytes = TA, *,
                uid: int = APP_UID, app: Path | None = None) -> tuple[PreparedModel, bool]:
        return prepare(self.driver, self.cache, (model or self.a).data, token,
                       app or self.app, uid=uid)

    def runs_a(self, m: PreparedModel) -> bool:
        return self.a.matches(m.run(self.a.inputs))


def _flip(pos: Callable[[int], int]) -> Callable[[bytes], bytes]:
    def f(b: bytes) -> bytes:
        if not b:
            return b"\x01"
        i = pos(len(b))
        return b[:i] + bytes([b[i] ^ 0x01]) + b[i + 1 :]

    return f


TAMPERS: dict[str, Callable[[bytes], bytes]] = {
    "flip-first-bit": _flip(lambda n: 0),
    "flip-middle-bit": _flip(lambda n: n // 2),
    "flip-last-bit": _flip(lambda n: n - 1),
    "append": lambda b: b + b"\x00",
    "append-garbage": lambda b: b + os.urandom(4096),
    "truncate": lambda b: b[: len(b) // 2],
    "truncate-one": lambda b: b[:-1],
    "empty": lambda b: b"",
}


class Rewriter:
    """A thread that keeps overwriting cache files (no locks, as an attacker would)
    with another model's genuine artifacts, in two halves."""

    def __init__(self, targets: list[str], sources: list[bytes]) -> None:
        self.targets, self.sources = targets, sources
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for target, src in zip(self.targets, self.sources, strict=True):
                with open(target, "r+b") as f:
                    f.truncate(0)
                    f.write(src[: len(src) // 2])
                    f.flush()
                    f.write(src[len(src) // 2 :])
            self.rounds += 1

    def __enter__(self) -> Rewriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _proc_rounds(make_driver: DriverFactory, options: dict[str, Any], name: str, state: str,
                 app: str, model: BuiltModel, blobs: tuple[list[bytes], list[bytes]],
                 rounds: int, q: multiprocessing.Queue[list[tuple[bool, bool]]]) -> None:
    """One process: alternately rewrite the entry with its genuine blobs and prepare."""
    driver = make_driver(options)
    n_model, n_data = driver.get_number_of_cache_files_needed()
    # Lock waits are bounded generously: this checks correctness under contention, not speed.
    cache = DriverCache(name, driver.version, n_model, n_data, state_root=Path(state),
                        lock_timeout_s=60.0)
    results = []
    try:
        for i in range(rounds):
            if i % 2:
                model_paths, data_paths = entry_paths(cache, app, TA)
                fds = open_cache_files(model_paths + data_paths, create=True)
                assert fds is not None
                try:
                    cache.save(TA, fds[:n_model], fds[n_model:], *blobs, uid=APP_UID)
                finally:
                    close_fds(fds)
            m, hit = prepare(driver, cache, model.data, TA, app)
            results.append((hit, model.matches(m.run(model.inputs))))
            m.release()
    finally:
        cache.close()
        driver.close()
    q.put(results)


class CacheSecuritySuite:
    """The attacks, one test each, against the ``cache_backend`` fixture's driver.

    ``cache_kinds``: the kinds of cache file the driver writes (a driver without data
    cache files sets ``("model",)``, so no tampering case targets files it never has).
    """

    cache_kinds: tuple[str, ...] = ("model", "data")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "kind" in metafunc.fixturenames:
            metafunc.parametrize("kind", list(self.cache_kinds))

    @pytest.fixture(scope="class")
    @classmethod
    def cache_driver(cls, cache_backend: CacheBackend) -> Iterator[Driver]:
        driver = cache_backend.make_driver(cache_backend.driver_options())
        try:
            yield driver
        finally:
            driver.close()

    @pytest.fixture
    def setup(self, cache_backend: CacheBackend, cache_driver: Driver, tmp_path: Path
              ) -> Iterator[Setup]:
        n_model, n_data = cache_driver.get_number_of_cache_files_needed()
        state = tmp_path / "state"
        cache = DriverCache(cache_backend.name, cache_driver.version, n_model, n_data,
                            state_root=state, lock_timeout_s=0.5)
        app = tmp_path / "app-cache"
        app.mkdir()
        other = tmp_path / "other-app-cache"
        other.mkdir()
        try:
            yield Setup(cache_backend, cache_driver, cache, app, state, other)
        finally:
            cache.close()

    def test_second_prepare_skips_compilation(self, setup: Setup) -> None:
        m1, hit1 = setup.prepare()
        m2, hit2 = setup.prepare()
        assert (hit1, hit2) == (False, True)
        assert setup.runs_a(m1) and setup.runs_a(m2)
        assert setup.cache.verifier.entries()[0].hits == 1

    def test_backend_never_sees_unverified_bytes(self, setup: Setup,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        setup.prepare()
        seen: list[int] = []
        real = setup.driver.load_artifacts

        def spy(m: list[bytes], d: list[bytes], opts: Any) -> PreparedModel:
            seen.append(1)
            return real(m, d, opts)

        monkeypatch.setattr(setup.driver, "load_artifacts", spy)
        p = setup.paths()[0]
        Path(p).write_bytes(TAMPERS["flip-middle-bit"](Path(p).read_bytes()))
        assert try_load(setup.driver, setup.cache, TA, setup.app) is None
        assert seen == [], "the backend was handed bytes that failed verification"

    @pytest.mark.parametrize("tamper", list(TAMPERS))
    def test_tampered_file_falls_back_to_compile(self, setup: Setup, kind: str,
                                                 tamper: str) -> None:
        setup.prepare()
        model_paths, data_paths = entry_paths(setup.cache, setup.app, TA)
        targets = model_paths if kind == "model" else data_paths
        assert targets, f"{setup.backend.name} wrote no {kind} cache files"
        for p in targets:  # every file of that kind
            Path(p).write_bytes(TAMPERS[tamper](Path(p).read_bytes()))
            assert try_load(setup.driver, setup.cache, TA, setup.app) is None
            m, hit = setup.prepare()  # falls back and rewrites
            assert not hit and setup.runs_a(m)
            m, hit = setup.prepare()
            assert hit and setup.runs_a(m)

    def test_swapped_files_within_an_entry(self, setup: Setup) -> None:
        setup.prepare()
        paths = setup.paths()
        if len(paths) < 2:
            pytest.skip("an entry of one file has nothing to swap")
        a, b = Path(paths[0]), Path(paths[-1])
        ab, bb = a.read_bytes(), b.read_bytes()
        a.write_bytes(bb)
        b.write_bytes(ab)
        m, hit = setup.prepare()
        assert not hit and setup.runs_a(m)

    def test_other_models_cache_copied_over(self, setup: Setup) -> None:
        setup.prepare()
        mb, hit = setup.prepare(setup.b, TB)
        assert not hit and setup.b.matches(mb.run(setup.b.inputs))
        for src, dst in zip(setup.paths(TB), setup.paths(TA), strict=True):
            shutil.copyfile(src, dst)
        assert try_load(setup.driver, setup.cache, TA, setup.app) is None
        m, hit = setup.prepare()
        out = m.run(setup.a.inputs)
        assert not hit and setup.a.matches(out) and not setup.b.matches(out)

    def test_flipped_token(self, setup: Setup) -> None:
        setup.prepare()
        flipped = bytes([TA[0] ^ 0x80]) + TA[1:]
        # The same (genuine) files presented under another token do not verify.
        for src, dst in zip(setup.paths(TA), setup.paths(flipped), strict=True):
            shutil.copyfile(src, dst)
        assert try_load(setup.driver, setup.cache, flipped, setup.app) is None
        m, hit = setup.prepare(token=flipped)
        assert not hit and setup.runs_a(m)

    def test_other_uids_files_under_this_apps_token_never_load(self, setup: Setup) -> None:
        """uid B compiles its own model under A's token and swaps its (genuine) files into
        A's directory: A's prepare misses and compiles A, it never runs B's model."""
        mb, hit = setup.prepare(setup.b, TA, uid=OTHER_UID, app=setup.other_app)
        assert not hit and setup.b.matches(mb.run(setup.b.inputs))
        for src, dst in zip(setup.paths(TA, setup.other_app), setup.paths(TA), strict=True):
            shutil.copyfile(src, dst)
        assert try_load(setup.driver, setup.cache, TA, setup.app) is None  # A has no entry
        m, hit = setup.prepare()
        out = m.run(setup.a.inputs)
        assert not hit and setup.a.matches(out) and not setup.b.matches(out)
        # With an entry of A's own, B's files swapped in again still do not load.
        for src, dst in zip(setup.paths(TA, setup.other_app), setup.paths(TA), strict=True):
            shutil.copyfile(src, dst)
        assert try_load(setup.driver, setup.cache, TA, setup.app) is None
        m, hit = setup.prepare()
        assert not hit and setup.runs_a(m)
        # Each uid's entry for the same token stands: both load their own model.
        m, hit = setup.prepare()
        assert hit and setup.runs_a(m)
        mb, hit = setup.prepare(setup.b, TA, uid=OTHER_UID, app=setup.other_app)
        assert hit and setup.b.matches(mb.run(setup.b.inputs))
        assert {(e.uid, e.token) for e in setup.cache.verifier.entries()} == {
            (APP_UID, TA), (OTHER_UID, TA)}

    def test_another_uid_recording_many_tokens_evicts_only_its_own(
            self, cache_backend: CacheBackend, cache_driver: Driver, tmp_path: Path) -> None:
        n_model, n_data = cache_driver.get_number_of_cache_files_needed()
        cache = DriverCache(cache_backend.name, cache_driver.version, n_model, n_data,
                            state_root=tmp_path / "state", max_entries=4,
                            max_entries_per_uid=2)
        app, other = tmp_path / "app", tmp_path / "other"
        app.mkdir()
        other.mkdir()
        a, b = cache_backend.model_a, cache_backend.model_b
        try:
            prepare(cache_driver, cache, a.data, TA, app)
            blobs = cache_driver.compile(b.data, OPTS).artifacts()
            flood = [bytes([0xB0, i]) + bytes(30) for i in range(12)]
            for token in flood:  # B floods the map with tokens of its own
                model_paths, data_paths = entry_paths(cache, other, token)
                fds = open_cache_files(model_paths + data_paths, create=True)
                assert fds is not None
                try:
                    assert cache.save(token, fds[:n_model], fds[n_model:], *blobs,
                                      uid=OTHER_UID)
                finally:
                    close_fds(fds)
            owners = [e.uid for e in cache.verifier.entries()]
            assert owners.count(OTHER_UID) == 2 and owners.count(APP_UID) == 1
            m, hit = prepare(cache_driver, cache, a.data, TA, app)
            assert hit and a.matches(m.run(a.inputs))  # A's entry survived the flood
        finally:
            cache.close()

    def _open(self, setup: Setup, flags: int) -> tuple[list[int], list[int]]:
        fds = [os.open(p, flags) for p in setup.paths()]
        return fds[: setup.cache.n_model], fds[setup.cache.n_model :]

    def test_wrong_number_of_fds(self, setup: Setup) -> None:
        setup.prepare()
        m, d = self._open(setup, os.O_RDWR)
        cache = setup.cache
        try:
            for mm, dd in ((m[:-1], d), (m + d[:1] + m[:1], d), ([], []), (m, d + m)):
                with pytest.raises(InvalidArgument):
                    cache.load(TA, mm, dd, uid=APP_UID)
            assert not cache.save(TA, m[:-1], d, [b""] * (len(m) - 1), [b""] * len(d),
                                  uid=APP_UID)
            assert cache.load(TA, m, d, uid=APP_UID)  # the failed save changed nothing
            with pytest.raises(InvalidArgument):
                cache.load(TA[:31], m, d, uid=APP_UID)
        finally:
            close_fds(m + d)

    def test_read_only_fds_load_but_do_not_save(self, setup: Setup) -> None:
        setup.prepare()
        m, d = self._open(setup, os.O_RDONLY)
        try:
            mb, db = setup.cache.load(TA, m, d, uid=APP_UID)
            assert setup.runs_a(setup.driver.load_artifacts(mb, db, OPTS))
            model = setup.driver.compile(setup.b.data, OPTS)
            assert not setup.cache.save(TA, m, d, *model.artifacts(), uid=APP_UID)  # fails
            assert setup.b.matches(model.run(setup.b.inputs))
            assert setup.cache.load(TA, m, d, uid=APP_UID)  # A's entry is intact
        finally:
            close_fds(m + d)

    def test_write_only_fds_are_invalid(self, setup: Setup) -> None:
        setup.prepare()
        m, d = self._open(setup, os.O_WRONLY)
        try:
            with pytest.raises(InvalidArgument):
                setup.cache.load(TA, m, d, uid=APP_UID)
        finally:
            close_fds(m + d)

    def test_nonzero_offsets_and_stale_sizes(self, setup: Setup) -> None:
        model = setup.driver.compile(setup.a.data, OPTS)
        blobs_m, blobs_d = model.artifacts()
        paths = setup.paths()
        for p, blob in zip(paths, [*blobs_m, *blobs_d], strict=True):
            Path(p).write_bytes(os.urandom(len(blob) + 100_000))  # larger than the artifact
        fds = open_cache_files(paths, create=False)
        assert fds is not None
        n = setup.cache.n_model
        try:
            for i, fd in enumerate(fds):
                os.lseek(fd, 1234 + i, os.SEEK_SET)
            assert setup.cache.save(TA, fds[:n], fds[n:], blobs_m, blobs_d, uid=APP_UID)
            for i, fd in enumerate(fds):
                os.lseek(fd, 77 * (i + 1), os.SEEK_SET)
            mb, db = setup.cache.load(TA, fds[:n], fds[n:], uid=APP_UID)
            assert setup.runs_a(setup.driver.load_artifacts(mb, db, OPTS))
        finally:
            close_fds(fds)

    @pytest.mark.slow
    def test_rewriter_during_save_and_load(self, setup: Setup) -> None:
        compile_and_save(setup.driver, setup.cache, setup.b.data, TB, setup.app)
        b_blobs = [Path(p).read_bytes() for p in setup.paths(TB)]
        setup.prepare()
        with Rewriter(setup.paths(TA), b_blobs) as rw:
            for _ in range(12):
                m, _hit = setup.prepare()  # saves and loads race the rewriter
                out = m.run(setup.a.inputs)
                assert setup.a.matches(out) and not setup.b.matches(out)
        assert rw.rounds > 0
        # Once the rewriter is gone the driver recovers: compile, save, then a hit.
        setup.prepare()
        m, hit = setup.prepare()
        assert hit and setup.runs_a(m)

    def test_restart_persistence_and_version_change(self, setup: Setup) -> None:
        setup.prepare()
        setup.cache.close()
        n_model, n_data = setup.driver.get_number_of_cache_files_needed()
        name, version = setup.backend.name, setup.driver.version
        setup.cache = DriverCache(name, version, n_model, n_data, state_root=setup.state)
        m, hit = setup.prepare()  # a restarted driver host
        assert hit and setup.runs_a(m)
        setup.cache.close()
        setup.cache = DriverCache(name, version + "+backend-update", n_model, n_data,
                                  state_root=setup.state)
        assert setup.cache.verifier.entries() == []
        m, hit = setup.prepare()
        assert not hit and setup.runs_a(m)
        m, hit = setup.prepare()
        assert hit

    @pytest.mark.slow
    def test_several_processes_rewrite_and_load(self, setup: Setup) -> None:
        """Three processes each alternate rewriting the entry (genuine blobs, under the
        driver's locks) and preparing from it: every load verifies, every output is A's."""
        model, _ = compile_and_save(setup.driver, setup.cache, setup.a.data, TA, setup.app)
        blobs = model.artifacts()
        backend = setup.backend
        ctx = multiprocessing.get_context("forkserver")
        q = ctx.Queue()
        procs = [
            ctx.Process(target=_proc_rounds, args=(
                backend.make_driver, backend.driver_options(), backend.name, str(setup.state),
                str(setup.app), setup.a, blobs, 6, q))
            for _ in range(3)
        ]
        for p in procs:
            p.start()
        results = [q.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        q.close()
        q.join_thread()
        flat = [r for rs in results for r in rs]
        assert all(ok for _, ok in flat)
        assert all(hit for hit, _ in flat), "a genuine entry failed to verify under contention"
        m, hit = setup.prepare()
        assert hit and setup.runs_a(m)


__all__ = ["OTHER_UID", "TA", "TAMPERS", "TB", "CacheBackend", "CacheSecuritySuite",
           "Rewriter", "Setup"]

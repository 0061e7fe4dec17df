"""BlobCache invariants under random operation sequences (hypothesis)."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.cache import BlobCache
from npumanager.testing.filewatch import DirectoryWatch

keys = st.binary(min_size=0, max_size=6)
values = st.binary(min_size=0, max_size=40)
ops = st.lists(st.tuples(st.sampled_from(["set", "get"]), keys, values), min_size=1, max_size=60)
policies = st.tuples(
    st.sampled_from(["random", "lru"]), st.sampled_from(["halve", "fit", "fit_halve"])
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, policy=policies, max_total=st.integers(min_value=1, max_value=120))
def test_bounds_and_values(
    ops: list[tuple[str, bytes, bytes]], policy: tuple[str, str], max_total: int
) -> None:
    c = BlobCache(None, 5, 30, max_total, policy, seed=0)
    model: dict[bytes, bytes] = {}  # what get may return for each key
    for op, k, v in ops:
        if op == "set":
            fits = 0 < len(k) <= 5 and 0 < len(v) <= 30 and len(k) + len(v) <= max_total
            c.set(k, v)
            if fits and c.get(k) == v:
                model[k] = v
        else:
            got = c.get(k)
            assert got is None or got == model.get(k)
        assert c.total_size <= max_total
        assert c.total_size == sum(len(x) + len(c.get(x) or b"") for x in c)
        for x in c:
            assert c.get(x) == model[x]  # only ever the last value stored for the key


@settings(max_examples=25, deadline=None)
@given(ops=ops, policy=policies)
def test_file_round_trip_preserves_contents(
    ops: list[tuple[str, bytes, bytes]], policy: tuple[str, str]
) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cache"
        c = BlobCache(path, 5, 30, 200, policy, build_id="b", seed=1)
        for op, k, v in ops:
            if op == "set":
                c.set(k, v)
        before = {k: c.get(k) for k in c}
        c.close()
        again = BlobCache(path, 5, 30, 200, policy, build_id="b")
        assert {k: again.get(k) for k in again} == before
        again.close()


def test_thread_safety(tmp_path: Path) -> None:
    c = BlobCache(tmp_path / "cache", 8, 64, 4096, ("lru", "fit"), build_id="b")

    def worker(i: int) -> None:
        for j in range(300):
            c.set(b"%d-%d" % (i, j % 40), b"v" * (j % 60 + 1))
            c.get(b"%d-%d" % (i, (j * 7) % 40))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.total_size <= 4096
    assert c.total_size == sum(len(k) + len(c.get(k) or b"") for k in c)
    c.close()
    assert len(BlobCache(tmp_path / "cache", 8, 64, 4096, build_id="b")) == len(c)


def test_real_timer_saves(tmp_path: Path) -> None:
    path = tmp_path / "cache"
    with DirectoryWatch(tmp_path) as watch:  # the save timer's file appears in tmp_path
        c = BlobCache(path, 8, 64, 4096, build_id="b", save_delay_s=0.01)
        c.set(b"k", b"v")
        assert watch.wait_until(path.exists, 5)
    assert BlobCache(path, 8, 64, 4096, build_id="b").get(b"k") == b"v"
    c.close()

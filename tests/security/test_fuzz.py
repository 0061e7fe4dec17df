"""The frame decoder and the compilation-cache loader under a coverage-guided fuzzer
(atheris/libFuzzer), each for a time budget.

``$NPU_FUZZ_SECONDS`` sets each budget (default 5 s here; `.ci/run` gives it 25 s):
no crash, no failed invariant (see ``fuzz_frames.py`` and ``fuzz_cache.py``). A crash
leaves its input in the test's temp dir, and the fuzzer's output names it. Without
atheris (no wheel for this Python) the same ``one_input`` runs under Hypothesis instead."""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.security import fuzz_cache
from tests.security.fuzz_frames import one_input

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = int(os.environ.get("NPU_FUZZ_SECONDS", "5"))
HAVE_ATHERIS = importlib.util.find_spec("atheris") is not None


@pytest.fixture(autouse=True, scope="module")
def _fuzz_cache_removed() -> Iterator[None]:
    """The in-process harness's cache directory goes with this module's tests (an xdist
    worker ends without running atexit: each run left one in /dev/shm)."""
    yield
    fuzz_cache.close()


def run_atheris(harness: str, tmp_path: Path, rss_mb: int) -> tuple[int, str]:
    """Run ``tests.security.HARNESS`` for the budget; (executions, the output's tail).

    ``rss_mb`` is what the harness may grow by. libFuzzer reads its peak RSS from
    ``getrusage`` and Linux carries that peak through fork and exec, so the fuzzer starts
    at this worker's peak (1 GiB in CI, where other tests in the worker loaded torch and
    OpenVINO: a fixed 1024 MiB limit failed at the first input). The limit is therefore
    this process's peak plus the budget."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rss_mb += resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    # The harness's state (the cache loader's map) in memory where possible, in a directory
    # removed here: the fuzzer's process ends with _exit, past any cleanup of its own.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    state = tempfile.mkdtemp(prefix="npu-fuzz-", dir=shm)
    try:
        r = subprocess.run(
            [sys.executable, "-m", f"tests.security.{harness}",
             f"-max_total_time={BUDGET_S}", f"-rss_limit_mb={rss_mb}", "-max_len=4096",
             f"-artifact_prefix={tmp_path}/", "-print_final_stats=1", str(corpus)],
            cwd=ROOT, capture_output=True, text=True, timeout=BUDGET_S + 120,
            env=dict(os.environ, NPU_FUZZ_CACHE_DIR=state))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    tail = r.stderr[-4000:]
    assert r.returncode == 0, f"the fuzzer found a failing input:\n{tail}"
    assert "Done " in r.stderr, tail
    return int(r.stderr.split("Done ", 1)[1].split()[0]), tail


no_atheris = pytest.mark.skipif(not HAVE_ATHERIS, reason="atheris is not installed for this "
                                "Python; the *_hypothesis tests run the same harnesses")


@no_atheris
def test_frame_decoder_under_atheris(tmp_path: Path) -> None:
    runs, tail = run_atheris("fuzz_frames", tmp_path, 1024)
    assert runs > 100 * BUDGET_S, f"too few executions ({runs}) to mean anything:\n{tail}"


@no_atheris
def test_cache_loader_under_atheris(tmp_path: Path) -> None:
    # Each input reads memfds under a lock and queries the map: slower than the decoder.
    runs, tail = run_atheris("fuzz_cache", tmp_path, 2048)
    assert runs > 10 * BUDGET_S, f"too few executions ({runs}) to mean anything:\n{tail}"


@settings(max_examples=300 if HAVE_ATHERIS else 3000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_frame_decoder_hypothesis(data: bytes) -> None:
    one_input(data)


@settings(max_examples=100 if HAVE_ATHERIS else 1000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_cache_loader_hypothesis(data: bytes) -> None:
    fuzz_cache.one_input(data)


def test_the_cache_harness_checks_something() -> None:
    # Each uid's genuine entry loads for it; under the other uid, or the other uid's token,
    # or with a byte changed, it does not (one_input asserts which outcome is right).
    cache, genuine = fuzz_cache._cache()
    hits = {e.uid: e.hits for e in cache.verifier.entries()}
    for owner in (0, 1):
        for claimed in (0, 1, 0x80, 0x81):
            fuzz_cache.one_input(bytes([owner, claimed, 0, 0]))
            fuzz_cache.one_input(bytes([owner, claimed, 1, 0, 0, 7]))
            fuzz_cache.one_input(bytes([owner, claimed, 3, 0]))
    entries = {(e.uid, bytes(e.token)) for e in cache.verifier.entries()}
    assert entries == {(uid, g[0]) for uid, g in genuine.items()}
    # Per uid: its own files under its own token (mode 0; mode 1 with nothing changed in
    # the model and a byte flipped in the data does not load).
    assert {e.uid: e.hits - hits[e.uid] for e in cache.verifier.entries()} == {
        uid: 1 for uid in genuine}
    # A model cache naming any other file never gets through the check on verified bytes.
    import onnx

    from npumanager.errors import GeneralFailure
    from npumanager.testing.external_models import referencing_model

    for loc in ("/etc/shadow", "../../etc/shadow"):
        fuzz_cache.one_input(bytes([0, 0, 2]) + referencing_model(loc))
        with pytest.raises(GeneralFailure, match=f"refers to external data '{loc}'"):
            fuzz_cache.reference_cache.check_external_refs(
                onnx.load_from_string(referencing_model(loc)), 1 << 20)


def test_the_harness_checks_something() -> None:
    # Well-formed frames in awkward reads: decoded, and the invariants hold.
    from npumanager.wire.framing import ERROR, PUSH, REQUEST, pack

    stream = b"".join([pack(REQUEST, 1, b"hello", b"x" * 30, 2), pack(PUSH, 0, b"p", b""),
                       pack(ERROR, 9, b"InvalidArgument", b"why")])
    for cuts in (b"", b"\x01", b"\x10\x40\x80\xff"):
        one_input(bytes([1, len(cuts)]) + cuts + stream)
    # A bound the stream exceeds, and garbage: ProtocolError inside, nothing escapes.
    one_input(bytes([0, 0]) + stream)
    one_input(bytes([2, 3, 5, 6, 7]) + b"\xff" * 64)

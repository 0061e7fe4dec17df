"""The frame decoder under a coverage-guided fuzzer (atheris/libFuzzer) for a time budget.

``$NPU_FUZZ_SECONDS`` sets the budget (default 5 s here; `.ci/run` gives it 25 s):
no crash, no failed invariant (see ``fuzz_frames.py``). A crash leaves its input in
the test's temp dir, and the fuzzer's output names it. Without atheris (no wheel for
this Python) the same ``one_input`` runs under Hypothesis instead."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.security.fuzz_frames import one_input

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = int(os.environ.get("NPU_FUZZ_SECONDS", "5"))
HAVE_ATHERIS = importlib.util.find_spec("atheris") is not None


@pytest.mark.skipif(not HAVE_ATHERIS, reason="atheris is not installed for this Python; "
                    "test_frame_decoder_hypothesis runs the same harness")
def test_frame_decoder_under_atheris(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "tests.security.fuzz_frames", f"-max_total_time={BUDGET_S}",
         "-rss_limit_mb=1024", "-max_len=4096", f"-artifact_prefix={tmp_path}/",
         "-print_final_stats=1", str(corpus)],
        cwd=ROOT, capture_output=True, text=True, timeout=BUDGET_S + 60)
    tail = r.stderr[-4000:]
    assert r.returncode == 0, f"the fuzzer found a failing input:\n{tail}"
    assert "Done " in r.stderr, tail
    runs = int(r.stderr.split("Done ", 1)[1].split()[0])
    assert runs > 100 * BUDGET_S, f"too few executions ({runs}) to mean anything:\n{tail}"


@settings(max_examples=300 if HAVE_ATHERIS else 3000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_frame_decoder_hypothesis(data: bytes) -> None:
    one_input(data)


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

"""bench/poll_turns_latency.py keeps working: a short run of both modes against real
driver hosts, two streams under two real uids (root only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "poll_turns_latency.py"
#: Two driver hosts and four stream processes importing ONNX Runtime, 2 x 2 s of calls:
#: ~20 s idle; the run's own timeout first, so a slow run fails with its output.
RUN_TIMEOUT_S = 240


@pytest.mark.slow
@pytest.mark.skipif(os.getuid() != 0, reason="the two streams are two uids (setuid)")
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_short_run_measures_both_streams_in_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    p = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "2", "--calls", "60", "--skip", "10",
         "--json", str(out)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"first-come", "turns"}
    for mode, rounds in runs.items():
        assert len(rounds) == 2, (mode, rounds)
        for streams in rounds:
            assert len(streams) == 2, (mode, streams)
            for s in streams:
                # Every call answered, each counted one served by its own burst.
                assert s["n"] == 50 and 0 < s["p50_us"] <= s["p99_us"], (mode, s)
                # (The 5 warm-up calls too, less the last one where the stats were read
                # before its count: the burst counts a request after its answer. A full
                # run also counted 306 for 300 + 5 once in a while: not traced.)
                assert s["served"] >= 60 + 5 - 1, (mode, s)
                # First come, first served never gives a window up for another uid.
                assert mode == "turns" or s["deferred"] == 0, (mode, s)
    assert "first-come  ahead" in p.stdout and "turns       behind" in p.stdout, p.stdout

"""bench/execute_overhead.py keeps working: a quick run against a real driver host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "execute_overhead.py"
#: A quick run starts real processes (the bench, one or two driver hosts importing ONNX
#: Runtime): about a minute on an idle 2-core machine, past pytest's 120 s beside a busy
#: loop and a full suite (seen: --against timed out there). The run's own timeout comes
#: first, so a slow run fails with its output rather than pytest's stack dump.
RUN_TIMEOUT_S = 270


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_quick_run_times_every_mode_tight_and_paced(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    p = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--only", "tiny,gru", "--json", str(out)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    # The run checks every mode's outputs against in-process ONNX Runtime before timing.
    assert p.returncode == 0, p.stdout + p.stderr
    assert "added p50" in p.stdout and "tiny added p50, tight" in p.stdout, p.stdout
    doc = json.loads(out.read_text())
    assert set(doc) == {"tiny [1,4] add", "gru step (VAD)"}
    for rows in doc.values():
        for mode in ("in-process", "driver", "burst"):
            for pace in ("tight", "30 Hz", "100 Hz", "1 kHz"):
                row = rows[f"{mode} @ {pace}"]
                assert row["n"] > 0 and 0 < row["p50_us"] <= row["p99_us"], (mode, pace, row)
                assert row["client_cpu_us"] > 0, (mode, pace, row)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_against_another_tree_adds_its_plain_and_burst_modes(tmp_path: Path) -> None:
    """--against DIR: a second driver host, run from DIR's source tree (here this same
    tree), serves the plain and burst modes again in the same run."""
    out = tmp_path / "result.json"
    tree = BENCH.parents[1]
    p = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--only", "tiny", "--json", str(out),
         "--against", str(tree)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["tiny [1,4] add"]
    for mode in ("driver", "burst"):
        row = rows[f"{mode} @{tree.name} @ 30 Hz"]
        assert row["n"] > 0 and row["driver_cpu_us"] > 0, (mode, row)

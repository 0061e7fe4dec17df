"""bench/contention.py --repeat N: the runs of N invocations interleaved, order
alternated, each invocation's table printed, then the summary over the N; its runs
faked here (no processes: what a run measures is tests/demo/test_contention.py's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import contention

from npumanager.demo.contention import RunResult, Stats


class FakeRun:
    """Stands in for ContentionRun: records the order runs were made in; the managed
    camera's contended p99 is 1.1, 1.4, 1.2 x alone in the 1st, 2nd, 3rd invocation."""

    made: list[str] = []

    def __init__(self, name: str, managed: bool, *args: Any, **kwargs: Any) -> None:
        self.name, self.managed = name, managed

    def run(self) -> RunResult:
        FakeRun.made.append(self.name)
        inv = (len(FakeRun.made) - 1) // 2
        r = RunResult(self.name)
        p99 = (1.1, 1.4, 1.2)[inv] if self.managed else 10.0
        r.camera = {"alone": Stats([1.0]), "contended": Stats([p99]),
                    "loading": Stats([p99])}
        r.llm_tokens_s = r.embedder_items_s = 100.0
        return r


def test_repeat_interleaves_invocations_and_summarizes_their_ratios(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    FakeRun.made = []
    monkeypatch.setattr(contention, "ContentionRun", FakeRun)
    monkeypatch.setattr(contention, "build_models", dict)
    out = tmp_path / "runs.json"
    monkeypatch.setattr(sys, "argv", ["contention.py", "--quick", "--repeat", "3",
                                      "--json", str(out)])
    assert contention.main() == 0
    assert FakeRun.made == ["unmanaged", "managed", "managed", "unmanaged",
                            "unmanaged", "managed"]
    text = capsys.readouterr().out
    assert "invocation 2 of 3: managed, unmanaged" in text
    # Each invocation's table keeps the columns in the order given, and its verdicts.
    heads = [ln.split() for ln in text.splitlines() if ln.startswith(" ")]
    assert heads == [["unmanaged", "managed"]] * 3
    assert text.count("1.40x alone (target <= 1.3x: FAIL)") == 2  # contended and loading
    summary = text.split("3 invocations interleaved")[1]
    assert "camera p99 contended x alone" in summary and "1.20x (1.10x-1.40x)" in summary
    assert ("verdicts on the medians, managed against unmanaged:\ncamera p99 contended: "
            "managed 1.20x alone (target <= 1.3x: PASS)") in summary
    data = json.loads(out.read_text())
    assert [[r["name"] for r in inv] for inv in data["invocations"]] == [
        ["unmanaged", "managed"]] * 3
    assert data["orders"][1] == ["managed", "unmanaged"]
    med = data["repeat"][0]["ratios"]["camera p99 contended x alone"]
    assert med["median"] == pytest.approx(1.2) and med["pass"] is True


def test_one_invocation_prints_and_writes_what_it_did_before(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    FakeRun.made = []
    monkeypatch.setattr(contention, "ContentionRun", FakeRun)
    monkeypatch.setattr(contention, "build_models", dict)
    out = tmp_path / "runs.json"
    monkeypatch.setattr(sys, "argv", ["contention.py", "--quick", "--json", str(out)])
    assert contention.main() == 0
    assert FakeRun.made == ["unmanaged", "managed"]
    text = capsys.readouterr().out
    assert "\ncontention: 2 runs (quick phases" in text and "median" not in text
    data = json.loads(out.read_text())
    assert [r["name"] for r in data] == ["unmanaged", "managed"]  # a list, as before

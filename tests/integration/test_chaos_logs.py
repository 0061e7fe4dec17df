"""`npu chaos` keeps the evidence a violation needs: the report names the run's directory
(npud.log with npud's and its driver hosts' output, stats/ with the apps' executes); a
temporary one is removed after a clean run only, and `--log-dir DIR` / `--keep` keep it.
The run itself is stubbed here (tests/integration/test_chaos.py runs the real one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npumanager.cli.main import build_parser
from npumanager.testing import chaos


def _fake_run(violation: str | None) -> Any:
    def run(root: Path, report: chaos.Report, duration: float, apps: int, seed: int) -> None:
        (root / "npud.log").write_text("npud ready\n")
        report.duration_s = duration
        if violation:
            report.violations.append(violation)
    return run


def test_a_clean_run_removes_its_temporary_directory_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chaos, "_run", _fake_run(None))
    report = chaos.run_chaos(1.0)
    assert report.log_dir == ""
    assert "logs: removed (a clean run; --keep or --log-dir DIR keeps them)" in report.render()


def test_a_violation_keeps_the_temporary_directory_and_the_report_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chaos, "_run", _fake_run("npud's SIGTERM stopped its driver host 1"))
    report = chaos.run_chaos(1.0)
    try:
        assert Path(report.log_dir, "npud.log").read_text() == "npud ready\n"
        assert f"logs: {report.log_dir}/npud.log (npud and its driver hosts)" in report.render()
        # The report itself beside them (a failed test's output may be gone by then).
        assert Path(report.log_dir, "report.txt").read_text() == report.render() + "\n"
        assert "npud's SIGTERM stopped its driver host 1" in report.render()
    finally:
        import shutil

        shutil.rmtree(report.log_dir, ignore_errors=True)


def test_keep_and_log_dir_keep_a_clean_run(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setattr(chaos, "_run", _fake_run(None))
    kept = chaos.run_chaos(1.0, keep=True)
    try:
        assert Path(kept.log_dir, "npud.log").is_file()
    finally:
        import shutil

        shutil.rmtree(kept.log_dir, ignore_errors=True)
    args = build_parser().parse_args(["chaos", "--duration", "1", "--log-dir",
                                      str(tmp_path / "run")])
    assert args.log_dir == tmp_path / "run" and not args.keep
    report = chaos.run_chaos(1.0, workdir=args.log_dir)
    assert report.log_dir == str(tmp_path / "run") and (tmp_path / "run" / "npud.log").is_file()


def test_a_stopped_host_is_named_with_what_npuds_log_says_of_it(tmp_path: Path) -> None:
    log = tmp_path / "npud.log"
    log.write_text(
        "12:40:40.308 info    npumanager.service.supervisor: driver reference is up "
        "(pid 24849, 1.0+ort1.32.0)\n"
        "npud ready on /tmp/x/rt/npu.sock (pid 24848, drivers: reference)\n")
    assert chaos._host_story(log, 24849) == (
        " (npud's log: 12:40:40.308 driver reference is up (pid 24849, 1.0+ort1.32.0))")
    assert chaos._host_story(log, 24843) == (
        " (npud's log never names it: it had not attached)")


@pytest.mark.parametrize(("text", "seconds"), [("600", 600.0), ("90s", 90.0), ("10m", 600.0),
                                               ("1h", 3600.0), ("0.5", 0.5)])
def test_duration_takes_seconds_or_a_unit(text: str, seconds: float) -> None:
    assert build_parser().parse_args(["chaos", "--duration", text]).duration == seconds


@pytest.mark.parametrize("text", ["10x", "m", "-1m", "0", ""])
def test_a_bad_duration_is_refused(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["chaos", "--duration", text])
    assert exited.value.code == 2 and "--duration" in capsys.readouterr().err


def test_npud_s_start_keeps_calling_the_harness_while_it_waits(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A restart blocks the loop until npud is ready; the harness's due SIGCONTs run
    meanwhile (``waiting``), so a driver host stopped for 0.3-2 s is not left stopped
    for the whole restart."""
    log = tmp_path / "npud.log"
    calls: list[float] = []

    class SlowNpud:
        """npud writing its ready line after 0.5 s."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            import time

            self.ready_at = time.monotonic() + 0.5

        def poll(self) -> None:
            import time

            if time.monotonic() >= self.ready_at:
                with open(log, "a") as f:
                    f.write("npud ready on x\n")
            return None

    monkeypatch.setattr(chaos.subprocess, "Popen", SlowNpud)
    npud = chaos.Npud(tmp_path, tmp_path, tmp_path / "npud.toml", log)
    import time

    npud.start(timeout=10.0, waiting=lambda: calls.append(time.monotonic()))
    # Every ~50 ms through the half second, not once at the end.
    assert len(calls) >= 5, calls

"""The contention comparison's machinery (bench/contention.py, `npu demo --compare`):
both runs really start their apps, npud and the driver, and every phase measures
something. Numbers are the bench's business; here only that they exist."""

from __future__ import annotations

import os

import pytest

from npumanager.demo.contention import (
    COMPARE_APP_KNOBS,
    ContentionRun,
    RunResult,
    Stats,
    Timing,
    build_models,
    driver_config,
    side_by_side,
    verdicts,
    voice_note,
)
from npumanager.service.rt_privilege import CAP_SYS_NICE, has_cap
from tests.demo.conftest import LeftBehind

pytestmark = pytest.mark.slow

TINY = Timing(alone_s=0.3, contended_s=0.6, loading_s=0.6, settle_s=0.1)


class LoadsOnce(ContentionRun):
    """A run whose loading phase lasts until the loader's first load has ended, however
    long that takes: check() asserts a load was measured, and with TINY's 0.6 s phase a
    loaded machine had none (a full suite beside other suites and a busy loop: the managed
    run's loads [], its camera and voice measured). The bench's phases (5 s quick, 15 s
    full) hold many loads; this test's only need one."""

    def phase(self, name: str, seconds: float) -> None:
        super().phase(name, seconds)
        if name == "loading":
            self.wait_for("loader", "loaded", 0.0)


@pytest.fixture(scope="module")
def models() -> dict[str, object]:
    return build_models()  # type: ignore[return-value]


def check(r: RunResult) -> None:
    assert r.errors == []
    for phase in ("alone", "contended", "loading"):
        assert r.camera[phase].ms, f"{r.name}: no camera frames while {phase}"
    assert r.work_done["decode"] > 0 and r.work_done["batch"] > 0
    assert r.voice.ms and r.loads.ms
    assert r.rss_peak_mib > 0
    # The background apps' rates over the loading phase too (a number: the phase is short,
    # and a busy machine may leave one at 0).
    assert r.llm_tokens_s_loading >= 0 and r.embedder_items_s_loading >= 0


@pytest.mark.parametrize("managed", [False, True], ids=["unmanaged", "managed"])
def test_a_run_measures_every_phase(models: dict[str, object], managed: bool,
        left_behind: LeftBehind) -> None:
    cfg = driver_config(reserved_channels=1, background_sched="nice") if managed else None
    r = LoadsOnce("m" if managed else "u", managed, TINY, models, cfg,  # type: ignore[arg-type]
                      device_probe=True).run()
    check(r)
    assert r.streams == 1  # one batch in flight by default
    # Each app's CPU, and (managed) the driver host's by thread and the device per app.
    # The role is measured (its value may round to 0: a 0.6 s phase is ~150 jiffies of the
    # machine, and on a loaded machine the managed embedder, which mostly waits on its
    # batches' answers, was once given none of them: "embedder CPU 0", passing alone).
    assert r.cpu_roles["contended"]["embedder"] >= 0
    assert {"camera", "voice", "llm"} <= set(r.cpu_roles["contended"])
    assert ("driver" in r.cpu_roles["contended"]) == managed
    if managed:
        assert r.host_threads["contended"]
        assert ({"llm", "embedder"} <= set(r.device) if os.getuid() == 0
                else len(r.device) == 1), r.device  # (one uid for every app)
    assert left_behind() == []  # apps, npud and its driver are gone


def test_an_embedder_with_two_batches_in_flight_uses_the_pipeline(
        models: dict[str, object], left_behind: LeftBehind) -> None:
    """The ablation row embedder-pipeline: the SDK's pipeline, two in flight."""
    r = ContentionRun("m2", True, TINY, models, driver_config(), phases=("alone", "contended"),
                      embedder_inflight=2).run()  # type: ignore[arg-type]
    assert r.errors == []
    assert r.embedder_batch.ms and r.embedder_items_s > 0
    assert r.streams == 2
    assert left_behind() == []


def test_the_camera_can_spin_and_its_driver_anticipate(models: dict[str, object],
        left_behind: LeftBehind) -> None:
    """The rows anticipate-300+spin: the camera's burst opened with a client spin (an app
    override), the driver anticipating its frames; the camera still gets every frame."""
    r = ContentionRun("as", True, TINY, models,  # type: ignore[arg-type]
                      driver_config(burst_anticipate_us=300), phases=("alone",),
                      app_knobs={"camera": {"spin_us": 1500.0}}).run()
    assert r.errors == []
    assert r.camera["alone"].ms
    assert left_behind() == []


def test_apps_can_run_on_a_second_driver_host(models: dict[str, object],
        left_behind: LeftBehind) -> None:
    """The rows loader-own-host / bg-own-host: the background apps ask npud for a second
    device (its own driver host) and prepare on it, each grant valid there only; the
    camera and voice stay on the first. Each host's CPU is its own role."""
    cfg = driver_config()
    cfg["driver"].append({**cfg["driver"][0], "name": "reference-bg"})
    r = LoadsOnce("two", True, TINY, models, cfg,  # type: ignore[arg-type]
                      devices=dict.fromkeys(("llm", "embedder", "loader"), "reference-bg")
                      ).run()
    check(r)  # every load granted on the second device and prepared there
    for phase in ("contended", "loading"):
        roles = r.cpu_roles[phase]
        assert roles["driver reference-bg"] > 0, roles  # the LLM's and embedder's steps
        assert "driver reference" in roles and roles["driver"] >= roles["driver reference-bg"]
    assert any(g.startswith("reference-bg/") for g in r.host_threads["contended"])
    assert left_behind() == []


@pytest.mark.fifo
@pytest.mark.skipif(os.geteuid() != 0 or not has_cap(CAP_SYS_NICE),
                    reason="needs root with CAP_SYS_NICE (each app its own uid, protection on)")
def test_the_compare_s_voice_gets_its_real_time_thread_as_the_camera_does(
        models: dict[str, object], left_behind: LeftBehind) -> None:
    """`npu demo --compare`'s managed run, as npud runs by default (protection "auto": on
    as root): the camera (FOREGROUND) and the voice assistant (VISIBLE) each asked for
    their executing thread and npud granted both; the run says so, by app."""
    said: list[str] = []
    r = ContentionRun("managed", True, TINY, models,  # type: ignore[arg-type]
                      phases=("alone", "contended"), log=said.append,
                      app_knobs=COMPARE_APP_KNOBS, protect_foreground=None).run()
    assert r.errors == []
    assert r.voice.ms
    grants = [s for s in said if "npud granted SCHED_FIFO" in s]
    # At the camera's start (its thread only), once the voice ran, at the run's end.
    assert len(grants) == 3, said
    assert "(camera)" in grants[0] and "foreground protection: on" in grants[0], grants
    assert "2 threads (camera, voice), demoted none" in grants[1], grants
    assert "(camera, voice)" in grants[2], grants
    assert left_behind() == []


def test_the_table_puts_runs_side_by_side() -> None:
    a, b = RunResult("unmanaged"), RunResult("managed")
    a.camera = {"alone": Stats([1.0, 2.0]), "contended": Stats([10.0, 40.0])}
    b.camera = {"alone": Stats([1.0, 2.0]), "contended": Stats([1.0, 2.5])}
    a.llm_tokens_s, b.llm_tokens_s = 100.0, 90.0
    a.embedder_items_s, b.embedder_items_s = 100.0, 50.0
    rows = side_by_side([a, b])
    assert rows[0] == ("", "unmanaged", "managed")
    assert all(len(r) == 3 for r in rows)
    cells = dict((r[0], r[1:]) for r in rows)
    assert cells["camera + voice + LLM + embedder"][0].endswith("1/2 late")
    assert cells["camera p99 contended / alone (same run)"] == ("20.00x", "1.25x")
    # The worst loading frames counted by where in their load they ended.
    b.load_pos = [0.0, 0.1, 0.5, 0.99, 1.0]
    cells = dict((r[0], r[1:]) for r in side_by_side([a, b]))
    assert cells["worst 5 % loading frames by fifth of a load"] == ("0 0 0 0 0", "2 0 1 0 2")
    # What the loading phase left the other background apps (no loading phase: "-").
    b.llm_tokens_s_loading, b.embedder_items_s_loading = 41.4, 900.0
    cells = dict((r[0], r[1:]) for r in side_by_side([a, b]))
    assert cells["LLM tokens/s / embedder items/s (loading)"] == ("- / -", "41 / 900")
    # The voice assistant's latency: a row of the table and a line beside the verdicts.
    a.voice, b.voice = Stats([0.3, 0.3, 0.5]), Stats([0.6, 0.6, 1.0])
    cells = dict((r[0], r[1:]) for r in side_by_side([a, b]))
    assert cells["voice p50/p99 (ms)"] == ("0.3 / 0.5", "0.6 / 1.0")
    assert voice_note(a, b) == ("voice assistant p50 / p99: managed 0.60 / 1.00 ms, "
                                "unmanaged 0.30 / 0.50 ms (2.00x / 2.00x; no target)")
    assert voice_note(a, RunResult("m")) == "voice assistant: not measured in both runs"
    lines = verdicts(a, b)
    assert any("1.25x alone (target <= 1.3x: PASS)" in ln for ln in lines)
    assert any("LLM tokens/s: managed 90 %" in ln and "PASS" in ln for ln in lines)
    assert any("embedder items/s: managed 50 %" in ln and "FAIL" in ln for ln in lines)
    assert any("both apps (mean of the two): managed 70 %" in ln and "FAIL" in ln
               for ln in lines)


def test_compare_refuses_a_running_npud() -> None:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "npumanager", "demo", "--compare",
                          "--runtime-dir", "/nonexistent"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, res.stderr
    assert "--compare starts its own npud" in res.stderr


CANNOT = {"app": "camera", "ev": "error", "what": "connect", "t": 0.0,
          "error": "LimitExceeded: uid 61001 already has 2 connections to manager"}


def test_a_run_stops_waiting_once_an_app_cannot_connect(models: dict[str, object]) -> None:
    """An app that reported it could not connect ends the run's wait at once (AppFailed,
    naming it and its error): every wait after it ran out its timeout (60 s) in vain."""
    from npumanager.demo.observe import AppFailed

    run = ContentionRun("managed", True, TINY, models)  # type: ignore[arg-type]
    run.events.add(dict(CANNOT))
    with pytest.raises(AppFailed, match="camera could not connect: LimitExceeded"):
        run.wait_for("llm", "decode", 0.0, timeout=5.0)


def test_compare_says_a_run_that_failed_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """`npu demo --compare` whose run fails (an app that cannot connect, one that never
    reports) says so in one line and exits 1: it ended in a traceback. (The run is made to
    fail here; stopping what it started is ContentionRun.run's own ``finally``.)"""
    from npumanager.demo import contention
    from npumanager.demo.observe import AppFailed

    def fail(self: ContentionRun) -> RunResult:
        raise AppFailed(dict(CANNOT))

    monkeypatch.setattr(contention.ContentionRun, "run", fail)
    assert contention.run_compare(color=False) == 1
    err = capsys.readouterr().err
    assert err == ("npu demo --compare: the unmanaged run: camera could not connect: "
                   "LimitExceeded: uid 61001 already has 2 connections to manager; stopped "
                   "(nothing it started is left running)\n"), err

"""The contention bench's one-queue device model (bench/contention.py --one-queue): in
unmanaged-1q the apps' own ONNX Runtime runs hold the token, in the 1q rows the driver
host's do and the apps never touch it. Who holds it is read from /proc/locks during
the phases."""

from __future__ import annotations

import os
import threading

import pytest

from npumanager.demo.contention import ContentionRun, Timing, build_models, driver_config
from npumanager.testing.proc_locks import queue_pids
from tests.demo.conftest import LeftBehind

pytestmark = pytest.mark.slow

TINY = Timing(alone_s=0.3, contended_s=0.8, loading_s=0.6, settle_s=0.1)


class Watched(ContentionRun):
    """A run that records who holds or waits for the device token while it measures."""

    holders: set[int]
    app_pids: dict[str, int]

    def phase(self, name: str, seconds: float) -> None:
        self.holders = getattr(self, "holders", set())
        self.app_pids = {n: p.pid for n, p in self.procs.items()}
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.001):
                held, waiting = queue_pids(self.queue_path)
                self.holders |= held | waiting

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            super().phase(name, seconds)
        finally:
            stop.set()
            t.join()


@pytest.mark.parametrize("managed", [False, True], ids=["unmanaged-1q", "1q-1ch"])
def test_one_queue_runs_take_the_token_where_the_model_says(managed: bool,
        left_behind: LeftBehind) -> None:
    cfg = driver_config(channels=1) if managed else None
    run = Watched("1q" if managed else "u1q", managed, TINY, build_models(), cfg,
                  phases=("alone", "contended"), device_queue=True)
    r = run.run()
    assert r.errors == []
    assert r.camera["alone"].ms and r.camera["contended"].ms
    assert r.work_done["decode"] > 0 and r.work_done["batch"] > 0
    apps = set(run.app_pids.values())
    assert run.holders, "nobody took the device token"
    if managed:
        assert not run.holders & apps  # the driver host's runs hold it, not the apps
        assert run.config["driver"][0]["options"]["device_queue_lock"] == run.queue_path
    else:
        # The background apps run back to back: each is seen with the token.
        assert {run.app_pids["llm"], run.app_pids["embedder"]} <= run.holders
        assert run.holders <= apps
    assert left_behind() == []


def test_without_the_model_nobody_takes_a_token() -> None:
    run = ContentionRun("u", False, TINY, {}, phases=())
    assert run.queue_path == "" and not run.device_queue


def test_an_unmanaged_app_can_run_its_sessions_as_the_driver_does(tmp_path: str) -> None:
    """unmanaged-1q-1t: the app's sessions on one intra-op thread, as the driver's; the
    dotted keys are ONNX Runtime config entries."""
    from npumanager.demo.contention_apps import OrtEngine

    engine = OrtEngine(os.path.join(str(tmp_path), "q"),
                       {"intra_op_num_threads": "1", "session.intra_op.allow_spinning": "0"})
    session, _ = engine.load(build_models()["camera"])
    so = session.get_session_options()
    assert so.intra_op_num_threads == 1
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert engine.queue is not None
    default, _ = OrtEngine().load(build_models()["camera"])
    assert default.get_session_options().intra_op_num_threads == 0  # ORT's own choice

"""A hostile app's model bytes in the background compile worker (#15).

An unconfigured uid is BACKGROUND, so its models compile in the driver's lowered child
process. Garbage, an empty model, a truncated one and a model whose graph ONNX Runtime
rejects each get a typed error; the worker keeps compiling for the next app (the bystander,
also BACKGROUND, prepares and executes after the attack)."""

from __future__ import annotations

from pathlib import Path

from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import prepare_outcomes
from tests.security.harness import ATTACKER, assert_device_served, needs_root

pytestmark = needs_root


def test_hostile_model_bytes_in_the_compile_worker_fail_harmlessly(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    good = add_model()
    # A graph node naming an input nothing produces: parses, fails in ORT's session.
    broken_graph = good.replace(b"\x0a\x01x", b"\x0a\x01q", 1)
    models: list[bytes | str] = [b"\xff" * 4096, b"", good[: len(good) // 2], broken_graph,
                                 good]
    got = procs.run_as(ATTACKER, None, prepare_outcomes, str(runtime_dir), models, timeout=90)
    for out in got[:-1]:
        assert isinstance(out, str) and out.split(":", 1)[0] in {
            "InvalidArgument", "GeneralFailure"}, got
    # The attacker's own good model after the garbage: the worker still compiles.
    assert got[-1] == "ok: [1.0, 2.0, 3.0, 4.0]", got
    assert_device_served(runtime_dir)

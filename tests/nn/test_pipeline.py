"""Pipelines (``model.pipeline()``, nn/pipeline.py) through a real driver host
subprocess: outputs in the order of their inputs and equal to plain executions, and
the driver still deciding for every execution in flight (thermal hold-back,
revocation); bad input is a typed error and the pipeline and model serve on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.constants import ThermalStatus
from npumanager.errors import GrantRevoked, InvalidArgument
from npumanager.testing.onnx_models import add_model

from .test_burst import Hal, X, dev, fake, hal, in_thread, reference, script  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_outputs_come_in_the_order_of_their_inputs(reference: Path, depth: int) -> None:  # noqa: F811
    d = nn.device("reference", reference)
    try:
        model = d.prepare_model(add_model(4))
        xs = [{"x": np.full((1, 4), i, np.float32)} for i in range(25)]
        with model.pipeline(depth=depth) as p:
            got = [o["y"] for o in p.map(xs)]
        assert len(got) == len(xs)
        for x, y in zip(xs, got, strict=True):
            np.testing.assert_array_equal(y, model.execute(x)["y"])
        with pytest.raises(InvalidArgument, match="closed"):
            p.submit(xs[0])
        model.release()
    finally:
        d.close()


def test_bad_depth_and_bad_input_are_typed_errors(hal: Hal, dev: nn.Device) -> None:  # noqa: F811
    model = dev.prepare_model(script(), grant=hal.grant())
    for depth in (0, 9):
        with pytest.raises(InvalidArgument, match="in flight"):
            model.pipeline(depth=depth)
    with model.pipeline() as p:
        with pytest.raises(InvalidArgument):
            list(p.map([X, {"nope": X["x"]}, X]))
        # The pipeline serves on after the error, as does the model.
        np.testing.assert_array_equal(next(p.map([X]))["y"], X["x"] + 1)
    np.testing.assert_array_equal(model.execute(X)["y"], X["x"] + 1)


def test_executions_in_flight_are_held_back_by_the_driver(hal: Hal, dev: nn.Device) -> None:  # noqa: F811
    model = dev.prepare_model(script(), grant=hal.grant())
    with model.pipeline() as p:
        np.testing.assert_array_equal(p.submit(X).result(30)["y"], X["x"] + 1)
        hal.wait_for(lambda: hal.of("ended"))  # (else the next continues its debouncing)
        hal.thermal(ThermalStatus.CRITICAL)  # an unknown uid's work (eff >= 1000) waits
        before = len(hal.of("requested"))
        xs = [{"x": X["x"] + i} for i in range(2)]
        futs = [p.submit(x) for x in xs]
        hal.wait_for(lambda: len(hal.of("requested")) > before)
        assert not any(f.done() for f in futs), "held back"
        hal.thermal(ThermalStatus.NONE)
        for x, f in zip(xs, futs, strict=True):
            np.testing.assert_array_equal(f.result(30)["y"], x["x"] + 1)


def test_a_revoked_model_ends_the_pipeline_with_grant_revoked(
        hal: Hal, dev: nn.Device) -> None:  # noqa: F811
    gid = hal.grant()
    model = dev.prepare_model(script(latency_ms=5), grant=gid)
    done: list[int] = []

    def endless() -> int:
        with model.pipeline() as p:
            for _ in p.map(iter(lambda: X, None)):
                done.append(1)
        return len(done)

    th, got = in_thread(endless)
    hal.wait_for(lambda: len(hal.of("ended")) >= 1)  # it runs
    hal.revoke(gid)
    th.join(60)
    assert not th.is_alive()
    assert len(got) == 1 and isinstance(got[0], GrantRevoked), got
    with pytest.raises(GrantRevoked):
        model.execute(X)

"""A burst's fixed request (nn/burst.py ``_FixedLayout``, drivers/burst_fixed.py): a
stream that repeats its request is answered ``SAME`` (no payload: the outputs lie where
the last full answer said) from a run bound once to its memory (ONNX Runtime's IO
binding), through a real reference driver host: the outputs stay those of in-process
ONNX Runtime whatever changes between executions (values in place, new arrays, the
model's input buffers and back, a priority), and anything that changes the request
gets a full answer first. A repeat of a request that is not the fixed one may be
answered SAME as well (the driver keeps any request whose bytes repeat)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from npumanager import nn
from npumanager.nn.burst import Burst
from npumanager.tensorio import burst as layout
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import gru_step_model

pytestmark = pytest.mark.slow


@pytest.fixture
def dev(runtime_dir: Path, state_dir: Path) -> Iterator[nn.Device]:
    with running_driver("reference", runtime_dir, state_dir, args=["--no-enforce-admission"]):
        d = nn.device("reference", runtime_dir)
        try:
            yield d
        finally:
            d.close()


def answered(b: Burst) -> tuple[int, int]:
    """(status, payload length) of the driver's last answer in the burst's memory."""
    assert b._pool is not None
    _, status, length = layout.read_response_header(b._pool.buf)
    return status, length


def test_a_repeated_request_is_answered_same_and_outputs_match_in_process(
        dev: nn.Device) -> None:
    onnx = gru_step_model()
    local = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    model = dev.prepare_model(onnx)
    rng = np.random.default_rng(1)
    frame = np.zeros((1, 512), np.float32)
    h = np.zeros((1, 1, 128), np.float32)

    def want(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in local.get_outputs()]
        return dict(zip(names, local.run(names, x), strict=True))

    with model.burst() as b:
        statuses = []
        for _ in range(6):
            frame[...] = rng.standard_normal((1, 512))  # the same array, new values
            got = b.execute({"frame": frame, "h": h})
            for k, v in want({"frame": frame, "h": h}).items():
                np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)
            h = got["h_out"]  # a new array every time
            statuses.append(answered(b))
        # The first answer in full; after it the same request (h is a new array each
        # time, copied into the same slot) is answered SAME with no payload.
        assert statuses[0][0] == layout.OK and statuses[0][1] > 0, statuses
        assert all(s == (layout.SAME, 0) for s in statuses[2:]), statuses
        # Another priority is another request: a full answer, then SAME again.
        x = {"frame": frame, "h": np.ones((1, 1, 128), np.float32)}
        for _ in range(2):
            got = b.execute(x, job_priority=5)
            for k, v in want(x).items():
                np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)
        # Views of the burst's memory with copy_outputs=False: rewritten in place.
        v1 = b.execute(x, copy_outputs=False)
        first = {k: v.copy() for k, v in v1.items()}
        x2 = {"frame": frame * 2, "h": x["h"]}
        v2 = b.execute(x2, copy_outputs=False)
        for k, v in want(x2).items():
            np.testing.assert_allclose(v2[k], v, rtol=1e-5, atol=1e-6)
        assert not all(np.array_equal(first[k], v2[k]) for k in first)
    model.release()


def test_inputs_moving_between_input_buffers_and_own_arrays(dev: nn.Device) -> None:
    onnx = gru_step_model()
    local = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    names = [o.name for o in local.get_outputs()]
    model = dev.prepare_model(onnx)
    rng = np.random.default_rng(2)
    with model.burst() as b:
        bufs = model.input_buffers()
        own = {"frame": np.zeros((1, 512), np.float32), "h": np.zeros((1, 1, 128), np.float32)}
        mixed = {"frame": bufs["frame"], "h": own["h"]}
        for i, x in enumerate([bufs, own, mixed, bufs, own, mixed, bufs]):
            for a in (bufs, own):
                a["frame"][...] = rng.standard_normal((1, 512))
                a["h"][...] = rng.standard_normal((1, 1, 128))
            got = b.execute(x)
            for k, v in zip(names, local.run(names, dict(x)), strict=True):
                np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6,
                                           err_msg=f"execution {i}")
        # New input buffers replace the old (the old pool is unregistered): the kept
        # request named the old pool, so the next one is decoded afresh.
        bufs2 = model.input_buffers()
        bufs2["frame"][...] = 1.0
        bufs2["h"][...] = 0.5
        for _ in range(2):
            got = b.execute(bufs2)
            for k, v in zip(names, local.run(names, dict(bufs2)), strict=True):
                np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)
        # A wrong shape is not the fixed request: the driver's typed error, as ever.
        with pytest.raises(Exception, match="frame"):
            b.execute({"frame": np.zeros((1, 256), np.float32), "h": own["h"]})
        got = b.execute(bufs2)
        for k, v in zip(names, local.run(names, dict(bufs2)), strict=True):
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)
    model.release()


def test_a_request_of_another_form_between_repeats_is_not_rung_as_the_kept_one(
        dev: nn.Device) -> None:
    """A repeat of the kept request rewrites neither the request nor its length, only the
    sequence number: a request of another form written between repeats (inputs given as
    lists: inline tensors, its own bytes) must make the next repeat write the kept request
    again, else the driver would run the other one's inputs (here: the last h inline)."""
    onnx = gru_step_model()
    local = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    names = [o.name for o in local.get_outputs()]
    model = dev.prepare_model(onnx)
    rng = np.random.default_rng(3)
    frame = np.zeros((1, 512), np.float32)
    h = np.zeros((1, 1, 128), np.float32)
    with model.burst() as b:
        for i in range(10):
            if i != 6:  # (6 repeats 5's request, bytes and all)
                frame[...] = rng.standard_normal((1, 512))
                h[...] = rng.standard_normal((1, 1, 128))
            if i in (3, 5, 6):
                # Lists of float32 rows: the frame goes to the data area, h inline.
                x: dict[str, object] = {"frame": list(frame * 3), "h": list(h)}
                want = dict(zip(names, local.run(names, {"frame": frame * 3, "h": h}),
                                strict=True))
            else:
                x = {"frame": frame, "h": h}
                want = dict(zip(names, local.run(names, {"frame": frame, "h": h}),
                                strict=True))
            got = b.execute(x)
            for k, v in want.items():
                np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6,
                                           err_msg=f"execution {i}")
            if i in (2, 6, 9):  # (6: the list request's repeat: SAME too)
                assert answered(b) == (layout.SAME, 0), i
    model.release()

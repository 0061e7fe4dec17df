"""hal/rt_wire.py: the host's request for SCHED_FIFO and npud's answer, with bad sizes
refused."""

from __future__ import annotations

import pytest

from npumanager.errors import InvalidArgument
from npumanager.hal import rt_wire as w


def test_round_trips() -> None:
    assert w.decode_request(w.encode_request(1234, 1)) == (1234, 1)
    assert w.decode_applied(w.encode_applied(1234, True)) == (1234, True, "")
    assert w.decode_applied(w.encode_applied(7, False, "no")) == (7, False, "no")
    assert len(w.encode_applied(7, False, "x" * 1000)) == 5 + 200  # why cut, not refused


@pytest.mark.parametrize("payload", [b"", b"\0" * 7, b"\0" * 9, b"\xff" * 100])
def test_a_request_of_the_wrong_size_is_refused(payload: bytes) -> None:
    with pytest.raises(InvalidArgument):
        w.decode_request(payload)


@pytest.mark.parametrize("payload", [b"", b"\0" * 4, b"\0" * 206])
def test_an_answer_of_the_wrong_size_is_refused(payload: bytes) -> None:
    with pytest.raises(InvalidArgument):
        w.decode_applied(payload)

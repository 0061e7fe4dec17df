"""Coverage-guided fuzzing of the frame decoder (npumanager/wire/framing.py).

Every byte a hostile peer sends goes through this decoder before anything
else looks at it. One input is: a frame bound, a way of cutting the stream
into reads, and the stream. For every input:

* the decoders raise nothing but ProtocolError (FrameTooLarge included);
* what :meth:`FrameDecoder.frames` decodes re-encodes to exactly the bytes it
  came from, in order (no frame is invented, dropped, or misread);
* :meth:`FrameDecoder.feed` + :func:`parse_frame` agree with it;
* the bounds hold: kinds 1-4, at most 253 fds, nothing buffered beyond one
  bounded frame, and :meth:`pending_fds` within 0..253.

Run it (atheris, libFuzzer flags) with
``python -m tests.security.fuzz_frames -max_total_time=25 [CORPUS_DIR]``;
``tests/security/test_fuzz.py`` does, with a time budget, and falls back to
Hypothesis over the same :func:`one_input` where atheris is not installed.
"""

from __future__ import annotations

import sys

try:
    import atheris
except ImportError:  # the Hypothesis fallback imports one_input only
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["npumanager.wire.framing"]):
        from npumanager.wire import framing
else:
    from npumanager.wire import framing

from npumanager.errors import ProtocolError

BOUNDS = (64, 1024, 1 << 20)


def _cuts(spec: bytes, n: int) -> list[int]:
    """Read boundaries within a stream of ``n`` bytes, from ``spec``."""
    if not n:
        return []
    return sorted({b * n // 256 for b in spec if b * n // 256 > 0})


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    max_frame = BOUNDS[data[0] % len(BOUNDS)]
    n_cuts = data[1] % 8
    spec, stream = data[2 : 2 + n_cuts], data[2 + n_cuts :]
    reads = []
    pos = 0
    for cut in [*_cuts(spec, len(stream)), len(stream)]:
        reads.append(stream[pos:cut])
        pos = cut

    # The connections' path.
    dec = framing.FrameDecoder(max_frame)
    got: list[framing.RawFrame] = []
    error: ProtocolError | None = None
    for chunk in reads:
        try:
            frames = dec.frames(chunk)
        except ProtocolError as exc:
            error = exc
            break
        got.extend(frames)
        if dec.error is not None:
            error = dec.error
            break
        assert dec.buffered <= max_frame + 4 + len(chunk), "buffered beyond one frame"
        assert 0 <= dec.pending_fds() <= framing.MAX_FDS
    encoded = b"".join(
        framing.pack(kind, call_id, framing.name_bytes(name), payload, n_fds)
        for kind, call_id, name, payload, n_fds in got)
    assert stream.startswith(encoded), "a decoded frame does not re-encode to its bytes"
    for kind, _call_id, _name, payload, n_fds in got:
        assert kind in (framing.REQUEST, framing.REPLY, framing.ERROR, framing.PUSH)
        assert 0 <= n_fds <= framing.MAX_FDS
        assert len(payload) <= max_frame
    if error is None and not dec.buffered:
        assert encoded == stream

    # The raw-body path must agree frame for frame.
    raw = framing.FrameDecoder(max_frame)
    bodies: list[bytes] = []
    try:
        for chunk in reads:
            bodies.extend(raw.feed(chunk))
        parsed = [tuple(framing.parse_frame(b)) for b in bodies]
    except ProtocolError:
        parsed = None
    if parsed is not None:
        assert parsed[: len(got)] == [tuple(f) for f in got], "feed/parse_frame disagree"

    try:
        framing.parse_frame(stream)
    except ProtocolError:
        pass


def main(argv: list[str]) -> None:
    if atheris is None:
        raise SystemExit("atheris is not installed (pip install atheris)")
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)

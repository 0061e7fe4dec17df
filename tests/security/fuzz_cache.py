"""Coverage-guided fuzzing of the compilation-cache loader.

A cache file lives in an app's directory: its owner (or anyone, in a careless
directory) can put any bytes there, under any uid's token. What the driver does
with them, in order, is what one input exercises:

1. :meth:`DriverCache.load`: the files (memfds here, as an app sends them) read
   under their lock, bounded in size, and verified against the map's keyed tag
   of (uid, token, bytes). A map holds one genuine entry per uid; an input picks
   the uid and token it claims, and the bytes (the genuine ones, mutated, or
   the fuzzer's own). Invariants: nothing escapes but InvalidArgument or
   GeneralFailure; a load succeeds only for the uid and token the entry was
   recorded for and exactly its bytes (so another uid's files, or its token,
   never verify); a file beyond the size bound is refused before it is read.
2. What runs on verified bytes, checked again as defence in depth: the model
   cache parsed as ONNX (protobuf classes only) and every external-data
   reference checked (:func:`check_external_refs`), and the same walk the host
   runs on every model an app sends (:func:`external_refs`). Invariants: only
   GeneralFailure from the first, only ValueError from the second; an accepted
   model refers to nothing but the data cache, within its bounds.

ONNX Runtime itself (native code that gets only bytes the driver wrote and
verified) is not fuzzed here.

Run it (atheris, libFuzzer flags) with
``python -m tests.security.fuzz_cache -max_total_time=25 [CORPUS_DIR]``;
``tests/security/test_fuzz.py`` does, with a time budget, and falls back to
Hypothesis over the same :func:`one_input` where atheris is not installed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

try:
    import atheris
except ImportError:  # the Hypothesis fallback imports one_input only
    atheris = None

_MODULES = ["npumanager.cache.verifier", "npumanager.drivers.cache_store",
            "npumanager.drivers.cache_io", "npumanager.drivers.reference_cache",
            "npumanager.tensorio.onnx_external"]
if atheris is not None:
    with atheris.instrument_imports(include=_MODULES):
        from npumanager.drivers import reference_cache
        from npumanager.drivers.cache_store import DriverCache
        from npumanager.tensorio import onnx_external
else:
    from npumanager.drivers import reference_cache
    from npumanager.drivers.cache_store import DriverCache
    from npumanager.tensorio import onnx_external

from npumanager.errors import GeneralFailure, InvalidArgument  # noqa: E402

#: Two apps' uids, and what each genuinely recorded: (token, model blob, data blob).
UIDS = (50001, 50002)
MAX_BYTES = 1 << 16


def _genuine() -> dict[int, tuple[bytes, bytes, bytes]]:
    """Real cache blobs of two real (tiny) models, as the reference driver writes them."""
    from npumanager.testing.onnx_models import add_model

    out = {}
    for i, uid in enumerate(UIDS):
        model, data = reference_cache.artifacts_from_onnx(add_model(4, float(i + 1)), "all")
        out[uid] = (bytes([0x10 + i]) * 32, model[0], data[0])
    return out


_state: dict[str, object] = {}


def _cache() -> tuple[DriverCache, dict[int, tuple[bytes, bytes, bytes]]]:
    if not _state:
        # In memory where possible: a genuine load counts a hit (a committed write). Under
        # $NPU_FUZZ_CACHE_DIR when set: libFuzzer ends its process with _exit, so the
        # atexit below never ran there and every run left a directory in /dev/shm; the
        # test that starts the fuzzer names a directory and removes it itself.
        parent = os.environ.get("NPU_FUZZ_CACHE_DIR") or (
            "/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
        d = Path(tempfile.mkdtemp(prefix="npu-fuzz-cache-", dir=parent))
        atexit.register(shutil.rmtree, d, True)
        _state["dir"] = d
        cache = DriverCache("fuzz", "v1", 1, 1, state_dir=d / "map", max_bytes=MAX_BYTES,
                            lock_timeout_s=1.0)
        genuine = _genuine()
        for uid, (token, model, data) in genuine.items():
            fds = [_memfd(model), _memfd(data)]
            try:
                assert cache.save(token, fds[:1], fds[1:], [model], [data], uid=uid)
            finally:
                for fd in fds:
                    os.close(fd)
        _state["cache"], _state["genuine"] = cache, genuine
    return _state["cache"], _state["genuine"]  # type: ignore[return-value]


def close() -> None:
    """Close the cache and remove its directory (in-process users: an xdist worker also
    ends without running atexit)."""
    cache, d = _state.get("cache"), _state.get("dir")
    _state.clear()
    if isinstance(cache, DriverCache):
        cache.close()
    if isinstance(d, Path):
        shutil.rmtree(d, ignore_errors=True)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("npu-fuzz", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _mutate(genuine: bytes, spec: bytes) -> bytes:
    """``genuine`` with a few bytes flipped, cut or extended, as ``spec`` says."""
    if not spec:
        return genuine
    out = bytearray(genuine)
    op = spec[0] % 4
    if op == 0 and out:  # flip bytes
        for b in spec[1:9]:
            out[b * len(out) // 256] ^= (b | 1)
    elif op == 1:  # truncate
        out = out[: (spec[1] if len(spec) > 1 else 0) * len(out) // 256]
    elif op == 2:  # append
        out += spec[1:]
    else:  # splice the fuzzer's bytes in
        at = (spec[1] if len(spec) > 1 else 0) * len(out) // 256
        out[at : at + len(spec) - 2] = spec[2:]
    return bytes(out)


def one_input(data: bytes) -> None:
    if len(data) < 4:
        return
    cache, genuine = _cache()
    owner = UIDS[data[0] % 2]
    claimed = UIDS[data[1] % 2]  # the uid the driver sees on the connection
    mode = data[2] % 4
    rest = data[3:]
    token, g_model, g_data = genuine[owner]
    if data[1] & 0x80:
        token = genuine[UIDS[1 - UIDS.index(owner)]][0]
    half = len(rest) // 2
    if mode == 0:  # the genuine files, as recorded
        model, blob = g_model, g_data
    elif mode == 1:  # mutated genuine files
        model, blob = _mutate(g_model, rest[:half]), _mutate(g_data, rest[half:])
    elif mode == 2:  # the fuzzer's model cache, the genuine data
        model, blob = rest, g_data
    else:  # a huge (sparse) file: refused by its size
        model, blob = g_model, g_data + b"\0" * (MAX_BYTES + 1 - len(g_data))

    # 1. The verified load.
    fds = [_memfd(model), _memfd(blob)]
    try:
        try:
            got = cache.load(token, fds[:1], fds[1:], uid=claimed)
        except (InvalidArgument, GeneralFailure):
            got = None
    finally:
        for fd in fds:
            os.close(fd)
    genuine_for_claimed = genuine[claimed]
    should = (token, model, blob) == genuine_for_claimed
    if got is not None:
        assert should, "a load verified bytes that are not what this uid recorded"
        assert [bytes(b) for b in got[0]] == [model] and [bytes(b) for b in got[1]] == [blob]
    else:
        assert not should, "the genuine entry did not load"

    # 2. What runs on verified bytes: the model cache parsed, its references checked.
    import onnx
    from google.protobuf.message import DecodeError

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(model)
    except (DecodeError, ValueError, RuntimeError):
        return
    try:
        refs = onnx_external.external_refs(proto)
    except ValueError:
        refs = None
    try:
        n = reference_cache.check_external_refs(proto, len(blob))
    except GeneralFailure:
        return
    assert refs is not None and n == len(refs)
    for ref in refs:
        assert ref.location == reference_cache.DATA_NAME
        assert ref.offset >= 0 and ref.offset + (ref.length or 0) <= len(blob)


def main(argv: list[str]) -> None:
    if atheris is None:
        raise SystemExit("atheris is not installed (pip install atheris)")
    _cache()
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)

"""Compilation cache: full compile vs load from cache, and what verification costs.

For generated models from ~1 MiB to a few hundred MiB of weights (plus one
graph-heavy model with thousands of small nodes) this measures, with the
reference backend (ONNX Runtime CPU):

- compile: a full prepare without cache (InferenceSession, ORT_ENABLE_ALL);
- save: the same compile producing the cache artifacts, then DriverCache.save
  (flock, truncate+write, fsync, keyed-hash record in SQLite);
- load: DriverCache.load (read every file once + keyed BLAKE3 verify, under
  the shared lock) + session_from_artifacts (deserialize, no re-optimization);
- the same bytes read from the files (pread, page cache warm) and copied in
  memory, next to the keyed BLAKE3 hash of those buffers (multi-threaded and
  single-threaded): verification throughput vs raw read throughput;
- verify share: verification time / total cache-load time.

A second table has a row per backend and device (the drivers themselves, through
DriverCache): the reference driver and OpenVINO on a small conv net, torch
AOTInductor on a small transformer block, each built here: compile s, verified
load s (read + keyed verify + the backend's load), compile/load, and the
verification's share of the load. AOTInductor's precompiled headers are built
by a warm-up compile first (a driver host keeps them in its state dir).

Usage: python bench/cache.py [--sizes small,medium,large,graph] [--backends
reference,openvino,torch] [--repeat N]
Not run in CI (the large model needs ~2 GB of RAM and some seconds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npumanager.cache.verifier import compute_tag
from npumanager.drivers.cache_io import read_cache_files
from npumanager.drivers.cache_store import DriverCache
from npumanager.drivers.reference_cache import (
    base_session_options,
    compile_with_artifacts,
    session_from_artifacts,
)
from npumanager.fds import close_fds
from npumanager.nn.cache_files import cache_file_names, open_cache_files

MIB = 1 << 20


def mlp(hidden: int, layers: int, seed: int = 0) -> tuple[bytes, np.ndarray, np.ndarray]:
    """An MLP (MatMul+Add+Relu per layer): its ONNX bytes, an input and the numpy output."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = rng.standard_normal((4, hidden)).astype(np.float32)
    ref = x
    prev = "x"
    for i in range(layers):
        w = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
        b = rng.standard_normal(hidden).astype(np.float32) * 0.1
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes += [
            helper.make_node("MatMul", [prev, f"W{i}"], [f"h{i}"]),
            helper.make_node("Add", [f"h{i}", f"B{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"y{i}"]),
        ]
        ref = np.maximum(ref @ w + b, 0)
        prev = f"y{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), x, ref


def graph_heavy(blocks: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Thousands of small nodes with constant subexpressions for the optimizer to fold."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes, inits = [], []
    x = rng.standard_normal((1, 64)).astype(np.float32)
    ref = x
    prev = "x"
    for i in range(blocks):
        c = rng.standard_normal(64).astype(np.float32) * 0.01
        inits.append(numpy_helper.from_array(c, f"c{i}"))
        nodes += [
            # (c * 2) + c is constant: folded at compile time
            helper.make_node("Mul", [f"c{i}", "two"], [f"c2_{i}"]),
            helper.make_node("Add", [f"c2_{i}", f"c{i}"], [f"c3_{i}"]),
            helper.make_node("Add", [prev, f"c3_{i}"], [f"s{i}"]),
            helper.make_node("Relu", [f"s{i}"], [f"r{i}"]),
            helper.make_node("Identity", [f"r{i}"], [f"o{i}"]),
        ]
        ref = np.maximum(ref + 3 * c, 0)
        prev = f"o{i}"
    inits.append(numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"))
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "graph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), x, ref


MODELS: dict[str, Callable[[], tuple[bytes, np.ndarray, np.ndarray]]] = {
    "small": lambda: mlp(256, 4),  # 1 MiB of weights
    "medium": lambda: mlp(1024, 16),  # 64 MiB
    "large": lambda: mlp(2048, 24),  # 384 MiB
    "graph": lambda: graph_heavy(1500),  # 7500 nodes, 0.4 MiB
}


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best (minimum) seconds over ``repeat`` runs, and the last result.

    The minimum, not the median: on a shared machine other processes only ever
    add time, and the bench compares pieces measured back to back.
    """
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def bench_model(name: str, repeat: int, work: Path, state: Path) -> dict[str, float]:
    import onnxruntime as ort

    onnx_bytes, x, ref = MODELS[name]()
    token = bytes([len(name)]) * 32
    app = work / name
    app.mkdir()
    cache = DriverCache(f"bench-{name}", "bench", 1, 1, state_root=state)
    try:

        def compile_only() -> Any:
            return ort.InferenceSession(
                onnx_bytes, sess_options=base_session_options("all"),
                providers=["CPUExecutionProvider"],
            )  # fmt: skip

        t_compile, _ = timed(compile_only, repeat)

        m_paths, d_paths = cache_file_names(app, token, 1, 1)

        def compile_and_save() -> int:
            _, mb, db = compile_with_artifacts(onnx_bytes, "all")
            fds = open_cache_files(m_paths + d_paths, create=True)
            assert fds is not None
            try:
                assert cache.save(token, fds[:1], fds[1:], mb, db, uid=os.getuid())
            finally:
                close_fds(fds)
            return len(mb[0]) + len(db[0])

        t_save, nbytes = timed(compile_and_save, repeat)

        def load() -> Any:
            fds = open_cache_files(m_paths + d_paths, create=False)
            assert fds is not None
            try:
                m, d = cache.load(token, fds[:1], fds[1:], uid=os.getuid())
            finally:
                close_fds(fds)
            return session_from_artifacts(m, d)

        t_load, session = timed(load, repeat)
        y = session.run(None, {"x": x})[0]
        assert np.allclose(y, ref, rtol=1e-3, atol=1e-3), "cached model computes wrong outputs"

        # The pieces of a load, on the very same buffers.
        def read() -> list[bytes]:
            fds = open_cache_files(m_paths + d_paths, create=False)
            assert fds is not None
            try:
                return read_cache_files(fds, 1 << 40)
            finally:
                close_fds(fds)

        t_read, bufs = timed(read, repeat)
        key = os.urandom(32)
        t_hash, _ = timed(lambda: compute_tag(key, os.getuid(), token, bufs[:1], bufs[1:]), repeat)
        t_copy, _ = timed(lambda: [bytearray(b) for b in bufs], repeat)

        import blake3

        def hash_1t() -> bytes:
            h = blake3.blake3(key=key, max_threads=1)
            for b in bufs:
                h.update(b)
            return h.digest()

        t_hash1, _ = timed(hash_1t, repeat)
        t_deser, _ = timed(lambda: session_from_artifacts(bufs[:1], bufs[1:]), repeat)
    finally:
        cache.close()
        shutil.rmtree(app, ignore_errors=True)
    gb = nbytes / 1e9
    return {
        "weights_mib": nbytes / MIB,
        "compile_s": t_compile,
        "save_s": t_save,
        "load_s": t_load,
        "deser_s": t_deser,
        "read_gbs": gb / t_read,
        "copy_gbs": gb / t_copy,
        "hash_gbs": gb / t_hash,
        "hash1_gbs": gb / t_hash1,
        "hash_s": t_hash,
        "read_s": t_read,
    }


def backend_row(kind: str, repeat: int, work: Path) -> dict[str, Any]:
    """Compile vs verified load through one driver, on the model that suits its backend."""
    from npumanager.drivers.base import CompileOptions
    from npumanager.testing import backend_models as bm

    opts = CompileOptions()
    if kind == "torch":
        from npumanager.drivers.torch_aot import TorchAotDriver

        driver: Any = TorchAotDriver({"state_dir": str(work / "torch-state"),
                                      "compile_memo_entries": 0})
        driver.compile(bm.torch_add_program(4), opts)  # warm-up: precompiled headers
        model = bm.transformer_block(d=256, heads=8, seq=64)
        label = "transformer block d=256 h=8 seq=64"
    else:
        if kind == "openvino":
            from npumanager.drivers.openvino import OpenVinoDriver

            driver = OpenVinoDriver({})
        else:
            from npumanager.drivers.reference import ReferenceDriver

            driver = ReferenceDriver({})
        model = bm.conv_net_onnx(channels=32, size=96)
        label = "conv net 3x conv c=32/64, 96x96"
    device = str(driver.capabilities().extra.get("device", "CPU"))
    n_model, n_data = driver.get_number_of_cache_files_needed()
    token = bytes([len(kind)]) * 32
    app = work / f"app-{kind}"
    app.mkdir()
    cache = DriverCache(f"bench-{kind}", driver.version, n_model, n_data,
                        state_root=work / "state")
    try:
        compile_fn = getattr(driver, "compile_with_artifacts", None) or driver.compile
        t_compile, prepared = timed(lambda: compile_fn(model.data, opts), repeat)
        assert model.matches(prepared.run(model.inputs)), f"{kind}: wrong outputs"
        m_blobs, d_blobs = prepared.artifacts()
        m_paths, d_paths = cache_file_names(app, token, n_model, n_data)
        fds = open_cache_files(m_paths + d_paths, create=True)
        assert fds is not None
        try:
            assert cache.save(token, fds[:n_model], fds[n_model:], m_blobs, d_blobs,
                              uid=os.getuid())
        finally:
            close_fds(fds)

        def load() -> Any:
            fds = open_cache_files(m_paths + d_paths, create=False)
            assert fds is not None
            try:
                m, d = cache.load(token, fds[:n_model], fds[n_model:], uid=os.getuid())
            finally:
                close_fds(fds)
            return driver.load_artifacts(m, d, opts)

        t_load, loaded = timed(load, repeat)
        assert model.matches(loaded.run(model.inputs)), f"{kind}: cached model is wrong"
        key = os.urandom(32)
        t_hash, _ = timed(lambda: compute_tag(key, os.getuid(), token, m_blobs, d_blobs), repeat)
        nbytes = sum(len(b) for b in [*m_blobs, *d_blobs])
    finally:
        cache.close()
        driver.close()
    return {"backend": kind, "device": device, "model": label, "mib": nbytes / MIB,
            "compile_s": t_compile, "load_s": t_load, "hash_s": t_hash}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,medium,large,graph")
    ap.add_argument("--backends", default="reference,openvino,torch")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    import importlib.util

    backends = [b for b in args.backends.split(",") if b and (
        b == "reference" or importlib.util.find_spec(b) is not None)]
    work = Path(tempfile.mkdtemp(prefix="npu-bench-cache-"))
    rows = []
    try:
        for name in sizes:
            r = bench_model(name, args.repeat, work, work / "state")
            rows.append((name, r))
            print(f"  {name}: done", file=sys.stderr, flush=True)
        backend_rows = []
        for kind in backends:
            backend_rows.append(backend_row(kind, args.repeat, work))
            print(f"  backend {kind}: done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"Compilation cache, reference backend (ORT CPU), {os.cpu_count()} CPUs, "
        f"best of {args.repeat}; files in the page cache (warm)\n"
    )
    hdr = (
        "| model | cache MiB | compile s | compile+save s | load s (read / verify / deserialize) "
        "| compile/load | read GB/s | BLAKE3 GB/s (MT / 1T) | copy GB/s | verify/read | "
        "verify/load |"
    )
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for name, r in rows:
        print(
            f"| {name} | {r['weights_mib']:.1f} | {r['compile_s']:.3f} | {r['save_s']:.3f} | "
            f"{r['load_s']:.3f} ({r['read_s']:.3f} / {r['hash_s']:.3f} / {r['deser_s']:.3f}) | "
            f"{r['compile_s'] / r['load_s']:.2f}x | {r['read_gbs']:.2f} | "
            f"{r['hash_gbs']:.2f} / {r['hash1_gbs']:.2f} | {r['copy_gbs']:.2f} | "
            f"{100 * r['hash_gbs'] / r['read_gbs']:.0f}% | "
            f"{100 * r['hash_s'] / r['load_s']:.1f}% |"
        )
    print(
        "\nverify/read: keyed BLAKE3 throughput (as used: multi-threaded from 8 MiB) as a share "
        "of reading the same files (target >= 70%).\nverify/load: hashing time as a share of a "
        "whole cache load (target <= 10%). compile/load > 1 means the cache saves time."
    )
    if backend_rows:
        print("\nPer backend and device (the drivers through DriverCache), "
              f"best of {args.repeat}\n")
        hdr = ("| backend | device | model | cache MiB | compile s | verified load s | "
               "compile/load | verify share of load |")
        print(hdr)
        print("|" + "---|" * (hdr.count("|") - 1))
        for r in backend_rows:
            print(f"| {r['backend']} | {r['device']} | {r['model']} | {r['mib']:.1f} | "
                  f"{r['compile_s']:.3f} | {r['load_s']:.4f} | "
                  f"{r['compile_s'] / r['load_s']:.1f}x | "
                  f"{100 * r['hash_s'] / r['load_s']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

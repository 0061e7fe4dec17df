"""A background LLM decode loop that gives the NPU back when asked and picks up where it was.

    npu serve --runtime-dir /tmp/npu &                  # npud + the reference driver
    python examples/llm_decode_loop.py --runtime-dir /tmp/npu --tokens 2000
    # meanwhile, e.g.: python examples/run_model.py --runtime-dir /tmp/npu
    #              or: npu thermal override severe --runtime-dir /tmp/npu   (then: reset)

Each decode job is one multi-step execution: ``model.execute(state, steps=N,
feedback={"h_out": "h", "pos_out": "pos"})`` runs N decode steps in the
driver, feeding each step's outputs into the next step's inputs (the driver
may pause the job between steps for more important work). Between jobs the
loop checks whether npud asked it to unload; if so it releases the model,
reports it unloaded, keeps its decode state in memory, and asks again. The
model is prepared with a compilation cache, so coming back is cheap.

Importance matters: npud preempts holders of *other* uids ranked below the
asker. Run this as a user other than the foreground app's (or set the uids'
importance with `npu importance set`).
"""

from __future__ import annotations

import argparse
import hashlib
import queue
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    NpuManager,
    RequestStatus,
    UnloadReason,
    nn,
)


def decoder_step(dim: int = 512, layers: int = 4) -> bytes:
    """One decode step: h_out = tanh(...tanh(h @ W1)... @ Wn), pos_out = pos + 1."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.ones((1, 1), np.float32), "one")]
    nodes = [helper.make_node("Add", ["pos", "one"], ["pos_out"])]
    prev = "h"
    for i in range(layers):
        w = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "h_out" if i == layers - 1 else f"a{i}"
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [out])]
        prev = out
    graph = helper.make_graph(
        nodes, "decoder-step",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, dim]),
         helper.make_tensor_value_info("pos", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, dim]),
         helper.make_tensor_value_info("pos_out", TensorProto.FLOAT, [1, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class Callback(ModelLoadRequestCallback):
    """Forwards npud's callbacks to the decode loop's queue (the loop does the work)."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self.events.put(("can", (status, listener)))

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        self.events.put(("unload", reason))

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        self.events.put(("complete", status))


def wait_for_grant(cb: Callback) -> Any:
    """Block until CAN_LOAD_NOW; return the listener (it carries the grant)."""
    while True:
        kind, payload = cb.events.get()
        if kind == "can":
            status, listener = payload
            print(f"  npud: {status.name}")
            if status == LoadStatus.CAN_LOAD_NOW:
                return listener
        elif kind == "complete":
            raise SystemExit(f"request ended {payload.name} before it was granted")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-dir", default=None)
    ap.add_argument("--device", default=None, help="device name (default: npud's first)")
    ap.add_argument("--tokens", type=int, default=512, help="tokens to decode in all")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per job")
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temporary directory")
    args = ap.parse_args()

    onnx = decoder_step()
    token = hashlib.sha256(onnx).digest()
    names = [d.name for d in nn.devices(args.runtime_dir)]
    if (args.device is not None and args.device not in names) or not names:
        raise SystemExit(f"no device {args.device!r}; npud serves: {', '.join(names)}" if names
                         else "npud serves no device (started with --no-drivers?)")
    device = nn.device(args.device or names[0], args.runtime_dir)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="npu-llm-cache-")
    try:
        decode(args, device, onnx, token, cache_dir)
    finally:
        device.close()
        if not args.cache_dir:  # our own temporary cache: leave nothing behind
            shutil.rmtree(cache_dir, ignore_errors=True)


def decode(args: argparse.Namespace, device: nn.Device, onnx: bytes, token: bytes,
           cache_dir: str) -> None:
    state = {"h": np.random.default_rng(1).standard_normal((1, 512)).astype(np.float32),
             "pos": np.zeros((1, 1), np.float32)}
    done = 0
    request_id = 0
    t_start = time.perf_counter()
    with NpuManager(args.runtime_dir) as mgr:
        while done < args.tokens:
            request_id += 1
            # The grant is valid on this device only.
            request = ModelLoadRequest(request_id, ModelSize.BETWEEN_1GB_AND_2GB,
                                       ModelPriority.BACKGROUND, device=device.name)
            cb = Callback()
            print(f"request {request_id}: asking npud (1-2 GB, BACKGROUND)")
            mgr.request_can_load_model(request, cb)
            listener = wait_for_grant(cb)
            t0 = time.perf_counter()
            model = device.prepare_model(onnx, grant=listener, cache_dir=cache_dir, token=token)
            how = "from cache" if model.loaded_from_cache else "compiled"
            print(f"  prepared in {(time.perf_counter() - t0) * 1000:.0f} ms ({how})")
            listener.notify_model_loaded(request)
            asked: UnloadReason | None = None
            revoked = False
            try:
                while done < args.tokens and asked is None:
                    steps = min(args.steps, args.tokens - done)
                    out = model.execute(state, steps=steps,
                                        feedback={"h_out": "h", "pos_out": "pos"})
                    state = {"h": out["h_out"], "pos": out["pos_out"]}
                    done = int(out["pos_out"][0, 0])
                    while not cb.events.empty():  # between jobs: any word from npud?
                        kind, payload = cb.events.get_nowait()
                        if kind == "unload":
                            asked = payload
            except nn.GrantRevoked:
                revoked = True  # we answered too late: npud ended the request REVOKED
            finally:
                model.release()
            if revoked:
                print(f"  our grant was revoked at token {done}; asking again")
                time.sleep(0.5)
            elif asked is not None:
                print(f"  npud asked us to unload ({asked.name}) at token {done}: released")
                listener.notify_model_unloaded(request)
                time.sleep(0.5)  # back off, then ask again
            elif done >= args.tokens:
                listener.notify_model_unloaded(request)
    rate = done / (time.perf_counter() - t_start)
    print(f"decoded {done} tokens ({rate:.0f} tokens/s overall)")


if __name__ == "__main__":
    from npumanager.errors import NpuError

    try:
        main()
    except NpuError as exc:  # npud absent or refusing: a sentence, not a traceback
        raise SystemExit(f"{__file__.rsplit('/', 1)[-1]}: {type(exc).__name__}: {exc}") from None
    except OSError as exc:  # --cache-dir: missing, a file, not writable
        raise SystemExit(f"{__file__.rsplit('/', 1)[-1]}: {exc.strerror}: {exc.filename}") \
            from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None

"""The torch driver (plugin ``torch``, extra ``npumanager[torch]``): AOTInductor.

Models are ``torch.export`` programs saved with ``torch.export.save`` (``.pt2``
bytes). ``compile`` vets the archive (no pickles, no compiled code:
:mod:`.torch_package`), loads it, and compiles it with AOTInductor into a
package: a zip holding a shared library with the weights. That package is the
model cache (``model_cache_files`` pieces, no data cache files).

A shared library loads only from a path, so every package, freshly compiled or
read from the app's cache files (and verified by the host first), is written
to a private file in the driver's own directory and loaded from there; the
app's file is never the one loaded. The driver's directory (option
``state_dir``, else a private temporary one) holds, in a fresh 0700 folder per
process: ``packages/`` (those copies, unlinked once loaded), ``tmp/`` (the
process's TMPDIR: the AOTInductor loader extracts the library there) and
``STATE/inductor/`` (TORCHINDUCTOR_CACHE_DIR and the precompiled headers,
instead of a predictable ``/tmp/torchinductor_$USER``; kept across restarts).
The driver points its host process's temp dir (TMPDIR, ``tempfile.tempdir``)
there and restores it at :meth:`close`. Inductor's own graph caches are off:
our verified cache is the cache, and a compile compiles.

Devices: ``cpu``, and ``cuda:N`` where torch sees GPUs: the first of the
``devices`` option is served (the same code with another device string; the
program is moved to the device before compiling).

Within one process a compiled package is remembered by the model's hash and
the compile options (``compile_memo_entries``, default 8; 0 disables it): a
second prepare of the same program skips the (many-second) AOTInductor
compile but still loads through the private copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from npumanager.drivers.base import (
    CompileOptions,
    Driver,
    DriverCapabilities,
    PreparedModel,
    TensorInfo,
)
from npumanager.drivers.torch_package import (
    check_package_names,
    vet_exported_program,
    write_private_copy,
)
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.paths import ensure_private_dir

log = logging.getLogger("npumanager.drivers.torch")

#: Package metadata key holding the model's named inputs and outputs.
IO_METADATA_KEY = "npumanager.io"
_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # torch warns about its own deprecations while exporting and compiling.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise InvalidArgument(f"tensors of {dtype} cannot cross the HAL (numpy has no {name})")
    return name


def _shape(val: Any) -> list[int]:
    return [int(d) if isinstance(d, int) or str(d).isdigit() else -1 for d in val.shape]


def program_signature(ep: Any) -> dict[str, list[list[Any]]]:
    """Named inputs and outputs of an exported program ({"inputs": [[name, dtype, shape]]})."""
    import torch.utils._pytree as pytree

    in_spec, out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec
    args_spec = in_spec.children_specs[0] if in_spec is not None else None
    kwargs_spec = in_spec.children_specs[1] if in_spec is not None else None
    if args_spec is None or (kwargs_spec is not None and kwargs_spec.num_leaves) or any(
        not c.is_leaf() for c in args_spec.children_specs
    ):
        raise InvalidArgument("the program's inputs must be positional tensors")
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    inputs = []
    for name in ep.graph_signature.user_inputs:
        val = nodes[name].meta.get("val")
        if val is None or not hasattr(val, "dtype"):
            raise InvalidArgument(f"program input {name!r} is not a tensor")
        inputs.append([name, _dtype_name(val.dtype), _shape(val)])
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    flat_outs = [a for a in pytree.tree_leaves(out_node.args[0])]
    if out_spec is not None and out_spec.type is dict:
        names = [str(k) for k in out_spec.context]
    else:
        names = [f"output{i}" for i in range(len(flat_outs))]
    outputs = []
    for name, node in zip(names, flat_outs, strict=True):
        val = getattr(node, "meta", {}).get("val")
        if val is None or not hasattr(val, "dtype"):
            raise InvalidArgument(f"program output {name!r} is not a tensor")
        outputs.append([name, _dtype_name(val.dtype), _shape(val)])
    return {"inputs": inputs, "outputs": outputs}


class AotModel(PreparedModel):
    """A loaded AOTInductor package; ``runners`` model instances run at once."""

    def __init__(self, loader: Any, package: bytes, device: str, n_model_cache: int) -> None:
        try:
            io_spec = json.loads(loader.get_metadata()[IO_METADATA_KEY])
            self.inputs = [TensorInfo(n, d, tuple(s)) for n, d, s in io_spec["inputs"]]
            self.outputs = [TensorInfo(n, d, tuple(s)) for n, d, s in io_spec["outputs"]]
        except (KeyError, ValueError, TypeError) as exc:
            raise GeneralFailure(f"the package does not describe its inputs: {exc}") from None
        self.loader = loader
        self.device = device
        self._package: bytes | None = package
        self._n_model_cache = n_model_cache
        io_bytes = sum(t.static_nbytes() or 0 for t in [*self.inputs, *self.outputs])
        self.memory_bytes = len(package) + 2 * io_bytes + (1 << 20)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        loader = self.loader
        if loader is None:
            raise GeneralFailure("the model was released")
        args = []
        for info in self.inputs:
            arr = inputs.get(info.name)
            if arr is None:
                raise InvalidArgument(f"missing input {info.name!r}")
            arr = np.ascontiguousarray(arr, dtype=info.dtype)
            if not arr.flags.writeable:  # torch.from_numpy wants writable memory
                arr = arr.copy()
            t = torch.from_numpy(arr)
            args.append(t if self.device == "cpu" else t.to(self.device))
        with torch.inference_mode():
            outs = loader.run(args)
        return {
            info.name: out.detach().cpu().numpy()
            for info, out in zip(self.outputs, outs, strict=True)
        }

    def release(self) -> None:
        self.loader = None
        self._package = None

    def artifacts(self) -> tuple[list[bytes], list[bytes]]:
        if self._package is None:
            raise GeneralFailure("the model was released")
        pkg, n = self._package, self._n_model_cache
        if n == 1:
            return [pkg], []
        step = -(-len(pkg) // n)
        return [pkg[i * step : (i + 1) * step] for i in range(n)], []


class TorchAotDriver(Driver):
    name = "torch"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        import torch

        n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        available = ["cpu", *(f"cuda:{i}" for i in range(n_cuda))]
        wanted = self.options.get("devices") or available
        self.devices = [str(d) for d in ([wanted] if isinstance(wanted, str) else wanted)]
        if not self.devices or any(d not in available for d in self.devices):
            raise InvalidArgument(f"torch sees devices {available}; asked for {self.devices}")
        self.device = self.devices[0]
        if self.device == "cpu":
            self.device_index = -1
            hw = f"cpu-{torch.backends.cpu.get_cpu_capability()}"
            self.device_name = hw
        else:
            self.device_index = int(self.device.partition(":")[2])
            major, minor = torch.cuda.get_device_capability(self.device_index)
            self.device_name = torch.cuda.get_device_name(self.device_index)
            hw = f"{self.device}-sm{major}{minor}"
        # The package is native code for this torch build and this hardware.
        self.version = f"1.0+torch{torch.__version__}+{hw}"
        self.n_model_cache = int(self.options.get("model_cache_files", 1))
        self.runners = max(1, int(self.options.get("runners", 2)))
        self.memo_entries = int(self.options.get("compile_memo_entries", 8))
        self._memo: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()  # AOTInductor's compiler and config are process-global
        self._setup_dirs()

    # --- private directories ------------------------------------------------------

    def _setup_dirs(self) -> None:
        """Private folders, and this process's temp dir pointed into them (module docstring)."""
        root = self.options.get("state_dir")
        if root:
            parent = ensure_private_dir(Path(str(root)))
            self.work_dir = Path(tempfile.mkdtemp(prefix="torch-", dir=parent))
            shared = parent / "inductor"
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix="npu-torch-"))
            shared = self.work_dir / "inductor"
        os.chmod(self.work_dir, 0o700)
        self.package_dir = ensure_private_dir(self.work_dir / "packages")
        tmp = ensure_private_dir(self.work_dir / "tmp")
        self.inductor_dir = ensure_private_dir(
            Path(str(self.options.get("inductor_cache_dir") or shared)))
        self._saved_env = {k: os.environ.get(k) for k in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
        self._saved_tempdir = tempfile.tempdir
        # torch writes beside gettempdir() (its default cache, precompiled headers) and the
        # AOTInductor loader extracts into $TMPDIR: both must be ours, not /tmp.
        os.environ["TMPDIR"] = str(tmp)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.inductor_dir)
        tempfile.tempdir = str(tmp)

    def _private_headers(self) -> None:
        """Point AOTInductor's precompiled headers (fixed at import to
        ``gettempdir()/torchinductor_USER``) into our folder, kept across restarts when
        ``state_dir`` is set: building them is most of a first compile."""
        from torch._inductor import codecache

        headers = self.inductor_dir / "precompiled_headers"
        codecache._HEADER_DIR = str(headers)
        codecache._HEADER_LOCK_DIR = str(headers / "locks")

    def close(self) -> None:
        saved, self._saved_env = getattr(self, "_saved_env", {}), {}
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if saved:
            tempfile.tempdir = self._saved_tempdir
        self._memo.clear()
        work = getattr(self, "work_dir", None)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    # --- the HAL ------------------------------------------------------------------

    def capabilities(self) -> DriverCapabilities:
        import torch

        if self.device == "cpu":
            try:
                memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError):
                memory = 8 << 30
            source = "physical RAM"
        else:
            memory = torch.cuda.get_device_properties(self.device_index).total_memory
            source = "torch.cuda device properties"
        memory = int(self.options.get("memory_bytes", memory))
        return DriverCapabilities(
            backend=f"torch {torch.__version__} AOTInductor {self.device} ({self.device_name})",
            memory_bytes=memory,
            extra={"device": self.device, "devices": list(self.devices),
                   "memory_source": source},
        )

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        return self.n_model_cache, 0

    def compile(self, onnx_bytes: bytes, options: CompileOptions) -> PreparedModel:
        """Compile a ``torch.export`` archive (the argument holds .pt2 bytes, not ONNX)."""
        key = hashlib.sha256(
            f"{options.preference}:{options.priority}:".encode() + onnx_bytes
        ).digest()
        with self._lock:
            package = self._memo.get(key)
            if package is not None:
                self._memo.move_to_end(key)
        if package is None:
            package = self._compile_package(onnx_bytes)
            if self.memo_entries > 0:
                with self._lock:
                    self._memo[key] = package
                    while len(self._memo) > self.memo_entries:
                        self._memo.popitem(last=False)
        return self._load(package)

    def _compile_package(self, data: bytes) -> bytes:
        import torch

        vet_exported_program(data)
        with self._lock, _quiet():
            try:
                ep = torch.export.load(io.BytesIO(data))
            except Exception as exc:
                raise InvalidArgument(f"torch cannot load this program: {exc}") from None
            signature = program_signature(ep)
            self._private_headers()
            if self.device != "cpu":
                from torch.export.passes import move_to_device_pass

                ep = move_to_device_pass(ep, self.device)
            out = self.package_dir / f"compile-{os.getpid()}-{threading.get_ident()}.pt2"
            try:
                torch._inductor.aoti_compile_and_package(
                    ep, package_path=str(out),
                    inductor_configs={
                        "aot_inductor.metadata": {IO_METADATA_KEY: json.dumps(signature)},
                        # A compile compiles: no reuse of Inductor's own (pickled) caches.
                        "fx_graph_cache": False,
                        "autotune_local_cache": False,
                    },
                )
                return out.read_bytes()
            except InvalidArgument:
                raise
            except Exception as exc:
                raise InvalidArgument(f"AOTInductor cannot compile this program: {exc}"
                                      ) from None
            finally:
                out.unlink(missing_ok=True)

    def load_artifacts(self, model_blobs: list[bytes], data_blobs: list[bytes],
                       options: CompileOptions) -> PreparedModel:
        """Load a verified package (only called after the host verified the blobs)."""
        if data_blobs:
            raise GeneralFailure("the torch driver keeps no data cache files")
        return self._load(model_blobs[0] if len(model_blobs) == 1 else b"".join(model_blobs))

    def _load(self, package: bytes) -> AotModel:
        import torch

        check_package_names(package)
        path = write_private_copy(self.package_dir, package)
        try:
            with self._lock, _quiet():
                loader = torch._C._aoti.AOTIModelPackageLoader(
                    str(path), "model", False, self.runners, self.device_index
                )
        except Exception as exc:
            raise GeneralFailure(f"the AOTInductor package does not load: {exc}") from None
        finally:
            # The loader has extracted what it needs into its own private folder.
            path.unlink(missing_ok=True)
        return AotModel(loader, package, self.device, self.n_model_cache)


__all__ = ["IO_METADATA_KEY", "AotModel", "TorchAotDriver", "program_signature"]

"""Devices: discovery through npud, the device connection, prepare with NNAPI caching.

A :class:`Device` holds one connection to its driver host (reopened after
the driver restarts; models prepared on the old connection are gone and
raise DeviceUnavailable). Any lost connection surfaces as
``DeviceUnavailable``, never as a hang.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from npumanager import paths
from npumanager.errors import (
    DeviceUnavailable,
    GrantMoved,
    GrantRequired,
    GrantRevoked,
    InvalidArgument,
    NpuError,
    ServiceUnavailable,
)
from npumanager.fds import close_fds
from npumanager.hal.wire import SERVICE
from npumanager.nn.cache_files import cache_file_names, open_cache_files
from npumanager.nn.model import Model
from npumanager.nn.model_move import Recipe
from npumanager.nn.token import check_token, driver_token
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.wire.client import SyncRpcClient
from npumanager.wire.framing import MAX_FDS

log = logging.getLogger("npumanager.nn")

#: Models larger than this travel to the driver in a memfd, not in the frame.
_ONNX_INLINE_LIMIT = 512 * 1024



#: Cache directories already said to be unusable: a warning once each, not per prepare.
_SAID_UNUSABLE: set[str] = set()


def _unusable_cache_dir(device: str, cache_dir: str) -> None:
    """The app asked for caching and gets none: a warning (it was an info line, which an
    app's default logging never shows), naming why, once per directory and process."""
    if not os.path.isdir(cache_dir):
        why = "no such directory"
    elif not os.access(cache_dir, os.W_OK | os.X_OK):
        why = "not writable by this process"
    else:
        why = "its cache files cannot be opened"
    level = logging.INFO if cache_dir in _SAID_UNUSABLE else logging.WARNING
    _SAID_UNUSABLE.add(cache_dir)
    log.log(level, "%s: cache_dir %s: %s; compiling without caching", device, cache_dir, why)

class ExecutionPreference(IntEnum):
    LOW_POWER = 0
    FAST_SINGLE_ANSWER = 1
    SUSTAINED_SPEED = 2


class Priority(IntEnum):
    """NNAPI compilation priority (larger = more important, as in NNAPI)."""

    LOW = 90
    MEDIUM = 100
    HIGH = 110


@dataclass(frozen=True)
class Capabilities:
    name: str
    version: str
    backend: str
    channels: int
    memory_bytes: int
    model_cache_files: int
    data_cache_files: int
    hal_version: int
    inline_limit: int
    enforce_admission: bool


def _grant_id(grant: object) -> str:
    """The grant id of a listener, a lease, or a plain string."""
    if grant is None:
        return ""
    if isinstance(grant, str):
        return grant
    gid = getattr(grant, "grant_id", None)
    if not gid:
        gid = getattr(getattr(grant, "listener", None), "grant_id", None)
    if not isinstance(gid, str) or not gid:
        raise GrantRequired(
            f"{type(grant).__name__} carries no grant: pass the listener from "
            "on_can_load_model(CAN_LOAD_NOW) or a lease from reserve()"
        )
    return gid


def _grant_lane(grant: object) -> str:
    """Which host of the device a grant is valid on, as npud's answer said (a listener's
    or a lease's ``lane``): "" its main host, "background" its background lane."""
    lane = getattr(grant, "lane", None)
    if lane is None:
        lane = getattr(getattr(grant, "listener", None), "lane", None)
    if not lane or not isinstance(lane, str):
        return ""
    if lane != paths.BACKGROUND_LANE:
        raise InvalidArgument(f"unknown lane {lane!r} (npud names \"\" or "
                              f"{paths.BACKGROUND_LANE!r})")
    return lane


def _model_bytes(model: str | os.PathLike[str] | bytes) -> bytes:
    if isinstance(model, bytes | bytearray | memoryview):
        return bytes(model)
    try:
        return Path(model).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"cannot read model {model}: {exc}") from None


def _open_external(model: str | os.PathLike[str] | bytes, onnx: bytes
                   ) -> tuple[list[str], list[int]]:
    """The external data files an ONNX model at a path names, opened here with the app's
    own rights: (their location strings, fds). The driver resolves the model's external
    data against these fds and never opens a path itself; a model given as bytes has no
    directory to resolve names in, so its references reach the driver as they are (and it
    refuses them). As ``onnx.load`` does, a location must stay inside the model's
    directory."""
    if isinstance(model, bytes | bytearray | memoryview) or b"location" not in onnx:
        return [], []  # no external-data entry can be in there: nothing to parse
    from npumanager.tensorio.onnx_external import external_refs, parse_onnx

    proto = parse_onnx(onnx)
    if proto is None:
        return [], []  # not ONNX (a torch archive, an IR bundle)
    try:
        locations = list(dict.fromkeys(ref.location for ref in external_refs(proto)))
    except ValueError as exc:
        raise InvalidArgument(f"model {model}: {exc}") from None
    base = Path(model).parent
    fds: list[int] = []
    try:
        for location in locations:
            rel = Path(location)
            if rel.is_absolute() or ".." in rel.parts:
                raise InvalidArgument(f"model {model} names external data {location!r} "
                                      "outside its directory")
            try:
                fds.append(os.open(base / rel, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                raise InvalidArgument(f"cannot read external data {location!r} of model "
                                      f"{model}: {exc.strerror}") from None
    except BaseException:
        close_fds(fds)
        raise
    return locations, fds


class Device:
    """A device (driver) as the runtime sees it."""

    def __init__(self, name: str, runtime_dir: str | os.PathLike[str] | None = None,
                 socket_path: str | None = None, number: int | None = None) -> None:
        self.name = name
        #: Its index in ``nn.devices()`` (what ``WorkInfo.device_number`` says); None when
        #: opened by name without listing.
        self.number = number
        #: npud's runtime dir (its socket: ``model.burst(realtime=True)`` asks npud).
        self.runtime_dir = runtime_dir
        self.socket_path = socket_path or str(paths.driver_socket(name, runtime_dir))
        self._lock = threading.Lock()
        self._rpc: SyncRpcClient | None = None
        self._caps: Capabilities | None = None
        #: Which of the device's hosts this connects to ("": its main one); the others,
        #: opened when a grant names them ([[driver]] background_host).
        self.lane_name = ""
        self._lanes: dict[str, Device] = {}
        #: The device as opened (its main host's); a lane's Device names the one it is of.
        self.home: Device = self

    def __repr__(self) -> str:
        state = "connected" if self._rpc is not None and not self._rpc.closed else "idle"
        return f"<Device {self.name} at {self.socket_path} {state}>"

    # --- connection ----------------------------------------------------------------

    def connection(self) -> SyncRpcClient:
        with self._lock:
            if self._rpc is None or self._rpc.closed:
                if self._rpc is not None:
                    self._rpc.close()
                    self._caps = None
                try:
                    self._rpc = SyncRpcClient(self.socket_path, SERVICE, threaded=False,
                                              client_name="nn")
                except ServiceUnavailable as exc:
                    raise DeviceUnavailable(f"device {self.name} is not available: {exc}"
                                            ) from None
            return self._rpc

    def call(self, rpc: SyncRpcClient, method: str, msg: Message,
             fds: Sequence[int] = ()) -> tuple[bytes, list[int]]:
        try:
            return rpc.call(method, msg, fds=fds)
        except ServiceUnavailable as exc:
            raise DeviceUnavailable(f"device {self.name} is not available: {exc}") from None

    def close(self) -> None:
        with self._lock:
            if self._rpc is not None:
                self._rpc.close()
                self._rpc = None
            lanes = list(self._lanes.values())
        for dev in lanes:
            dev.close()

    def lane(self, lane: str) -> Device:
        """This device as served by its ``lane`` host (``"background"``: the second host
        process of a [[driver]] with ``background_host``, socket ``NAME.background.sock``);
        ``""``: itself. A model prepared there runs there: execute, burst, pipeline and
        release go to that host's connection."""
        if not lane or lane == self.lane_name:
            return self
        with self._lock:
            dev = self._lanes.get(lane)
            if dev is None:
                dev = Device(self.name, self.runtime_dir,
                             str(paths.lane_socket(self.socket_path, lane)), self.number)
                dev.lane_name = lane
                dev.home = self
                self._lanes[lane] = dev
        return dev

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- IDevice ---------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        rpc = self.connection()
        if self._caps is None:
            payload, _ = self.call(rpc, "device.capabilities", Empty())
            m = pb.Capabilities.FromString(payload)
            self._caps = Capabilities(
                name=m.name, version=m.version, backend=m.backend, channels=m.channels,
                memory_bytes=m.memory_bytes, model_cache_files=m.model_cache_files,
                data_cache_files=m.data_cache_files, hal_version=m.hal_version,
                inline_limit=m.inline_limit or 65536, enforce_admission=m.enforce_admission,
            )
        return self._caps

    @property
    def version(self) -> str:
        return self.capabilities.version

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        rpc = self.connection()
        payload, _ = self.call(rpc, "device.get_number_of_cache_files_needed", Empty())
        m = pb.CacheFilesNeeded.FromString(payload)
        return m.n_model, m.n_data

    def prepare_model(
        self,
        model: str | os.PathLike[str] | bytes,
        grant: Any = None,
        preference: ExecutionPreference | int = ExecutionPreference.FAST_SINGLE_ANSWER,
        priority: Priority | int = Priority.MEDIUM,
        cache_dir: str | os.PathLike[str] | None = None,
        token: bytes | None = None,
    ) -> Model:
        """Prepare ``model`` (ONNX path or bytes) under ``grant``; NNAPI caching if asked.
        On the device's host that npud said the grant is valid on (the listener's or
        lease's ``lane``: a BACKGROUND request's on a device with a background lane), or
        on the other one if the grant moved there since (GrantMoved: its app's class
        changed). The model follows its grant if it moves later (nn/model_move.py)."""
        lane = _grant_lane(grant)
        if lane and not self.lane_name:  # (a lane's own Device prepares where it is)
            return self.lane(lane).prepare_model(model, grant, preference, priority,
                                                 cache_dir, token)
        grant_id = _grant_id(grant)
        try:
            return self.prepare_here(model, grant_id, preference, priority, cache_dir, token)
        except GrantMoved:
            other = self.home.lane("" if self.lane_name else paths.BACKGROUND_LANE)
            return other.prepare_here(model, grant_id, preference, priority, cache_dir, token)

    def prepare_here(
        self,
        model: str | os.PathLike[str] | bytes,
        grant_id: str,
        preference: ExecutionPreference | int = ExecutionPreference.FAST_SINGLE_ANSWER,
        priority: Priority | int = Priority.MEDIUM,
        cache_dir: str | os.PathLike[str] | None = None,
        token: bytes | None = None,
    ) -> Model:
        """Prepare ``model`` on this host (this Device's lane), whatever the grant says."""
        prepared = self._prepare_here(model, grant_id, preference, priority, cache_dir, token)
        prepared.recipe = Recipe(self.home, model, grant_id, int(preference), int(priority),
                                 cache_dir, token)
        return prepared

    def _prepare_here(
        self,
        model: str | os.PathLike[str] | bytes,
        grant_id: str,
        preference: ExecutionPreference | int,
        priority: Priority | int,
        cache_dir: str | os.PathLike[str] | None,
        token: bytes | None,
    ) -> Model:
        if int(preference) not in (0, 1, 2):
            raise InvalidArgument(f"unknown execution preference {preference!r}")
        if int(priority) not in (90, 100, 110):
            raise InvalidArgument(f"unknown priority {priority!r}")
        if token is not None:
            check_token(token)
        onnx = _model_bytes(model)
        rpc = self.connection()
        if cache_dir is None or token is None:
            return self._prepare(rpc, model, onnx, grant_id, int(preference), int(priority),
                                 b"", [], 0)
        n_model, n_data = self.get_number_of_cache_files_needed()
        if n_model + n_data == 0:
            return self._prepare(rpc, model, onnx, grant_id, int(preference), int(priority),
                                 b"", [], 0)
        # Each host its own cache files: a host trusts only the entries its own cache map
        # recorded, and a model that follows its grant to the other host would otherwise
        # rewrite the first host's files (and miss there on the way back).
        host_name = f"{self.name}.{self.lane_name}" if self.lane_name else self.name
        dtoken = driver_token(token, host_name, self.version, int(preference), int(priority))
        # "~/.cache/myapp" (the README's own example) named a directory "~" under the cwd:
        # never there, so every prepare compiled.
        cache_dir = os.path.expanduser(os.fspath(cache_dir))
        model_paths, data_paths = cache_file_names(cache_dir, dtoken, n_model, n_data)
        fds = open_cache_files([*model_paths, *data_paths], create=False)
        if fds is not None:
            try:
                return self._prepare_from_cache(rpc, grant_id, dtoken, n_model, n_data, fds,
                                                int(preference), int(priority))
            except (GrantRequired, GrantRevoked, DeviceUnavailable):
                raise  # a full compile would fail the same way
            except NpuError as exc:
                log.info("%s: cache miss (%s); compiling", self.name, exc)
            finally:
                close_fds(fds)
        fds = open_cache_files([*model_paths, *data_paths], create=True)
        if fds is None:
            _unusable_cache_dir(self.name, cache_dir)
            return self._prepare(rpc, model, onnx, grant_id, int(preference), int(priority),
                                 b"", [], 0)
        try:
            return self._prepare(rpc, model, onnx, grant_id, int(preference), int(priority),
                                 dtoken, fds, n_model)
        finally:
            close_fds(fds)

    def _prepare(self, rpc: SyncRpcClient, model: str | os.PathLike[str] | bytes, onnx: bytes,
                 grant_id: str, preference: int, priority: int, token: bytes,
                 cache_fds: list[int], n_model: int) -> Model:
        msg = pb.PrepareModel(
            grant_id=grant_id, preference=preference, priority=priority, token=token,
            n_model_cache=n_model if cache_fds else 0,
            n_data_cache=len(cache_fds) - n_model if cache_fds else 0,
        )
        locations, ext_fds = _open_external(model, onnx)
        fds = list(cache_fds)
        memfd = -1
        try:
            if len(fds) + 1 + len(ext_fds) > MAX_FDS:
                raise InvalidArgument(
                    f"the model names {len(ext_fds)} external data files; one prepare "
                    f"sends at most {MAX_FDS - 1 - len(fds)} (save it with "
                    "all_tensors_to_one_file=True)")
            if len(onnx) > _ONNX_INLINE_LIMIT:
                memfd = os.memfd_create("npu-model", os.MFD_CLOEXEC)
                _write_all(memfd, onnx)
                msg.onnx_in_memfd = True
                msg.onnx_size = len(onnx)
                fds.append(memfd)
            else:
                msg.onnx = onnx
            msg.external_locations.extend(locations)
            fds += ext_fds
            payload, _ = self.call(rpc, "device.prepare_model", msg, fds=fds)
        finally:
            if memfd >= 0:
                os.close(memfd)
            close_fds(ext_fds)
        return Model(self, rpc, pb.PreparedModelMsg.FromString(payload))

    def _prepare_from_cache(self, rpc: SyncRpcClient, grant_id: str, token: bytes,
                            n_model: int, n_data: int, fds: list[int], preference: int,
                            priority: int) -> Model:
        msg = pb.PrepareModelFromCache(grant_id=grant_id, token=token, n_model_cache=n_model,
                                       n_data_cache=n_data, preference=preference,
                                       priority=priority)
        payload, _ = self.call(rpc, "device.prepare_model_from_cache", msg, fds=fds)
        return Model(self, rpc, pb.PreparedModelMsg.FromString(payload))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]

"""The driver plugin API: what a vendor implements, and how npud finds and checks it.

A driver package registers a :class:`Driver` subclass in the
``npumanager.drivers`` entry-point group. The driver host loads it, checks it
the way pluggy checks hooks (HAL version, every required method present and
callable, cache file counts within NNAPI's limit) and refuses a plugin that
fails with a :class:`DriverRefused` naming the driver and what is wrong,
before any client can reach it.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

import numpy as np

from npumanager.cachetoken import MAX_NUMBER_OF_CACHE_FILES
from npumanager.config import suggest
from npumanager.errors import DriverRefused
from npumanager.hal.types import HAL_VERSION
from npumanager.tensorio.specs import TensorSpec

ENTRY_POINT_GROUP = "npumanager.drivers"
#: NNAPI's MAX_NUMBER_OF_CACHE_FILES, for each kind of cache file.
MAX_CACHE_FILES = MAX_NUMBER_OF_CACHE_FILES

#: Methods a driver must implement (name -> what it is for), checked at load.
REQUIRED_DRIVER_METHODS = {
    "capabilities": "device capabilities",
    "get_number_of_cache_files_needed": "compilation caching (return (0, 0) if unsupported)",
    "compile": "prepare_model",
    "load_artifacts": "prepare_model_from_cache",
    "temperature": "the thermal model (return None without one)",
    "close": "shutdown",
}
REQUIRED_MODEL_METHODS = ("run", "release", "artifacts")


#: A model input or output (the plugin API's name for :class:`TensorSpec`).
TensorInfo = TensorSpec


@dataclass(frozen=True)
class DriverCapabilities:
    backend: str
    memory_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompileOptions:
    """What prepare_model passes on: NNAPI preference (0..2) and priority (90/100/110),
    and the model's external data (``external_data``: location -> its bytes, uint8).

    The host has bound every external reference of an ONNX model to the files its client
    sent (:mod:`npumanager.drivers.external_data`): what is left in the model names only
    locations in ``external_data``. A driver resolves them there and nowhere else; one
    whose class leaves ``Driver.accepts_external_data`` False never sees any."""

    preference: int = 1
    priority: int = 100
    external_data: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: The model's execution class is BACKGROUND (drivers/classes.py): a backend may
    #: size its threads for it (the reference driver: intra_op_threads_background).
    background: bool = False


class PreparedModel(ABC):
    """A compiled model. ``run`` may be called from several worker threads at once.

    What the host calls, for a driver writer: ``run`` (required) executes once;
    ``release`` frees the model. Optional hooks, each with a default that works
    through ``run``: ``run_into`` writes outputs into given arrays (views of a
    client's shared memory); ``bind`` returns a run bound once to fixed input and
    output arrays, which a burst's repeated request calls instead of ``run_into``
    on every execution (return None to decline); ``begin_step`` hands the job's
    priority to the backend before a step; ``abort`` ends a run early;
    ``artifacts`` gives the compilation-cache blobs; ``backend_state`` reports
    knobs for ``device.stats``. The README's "Writing a driver" says the same."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    memory_bytes: int

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute once; raise to report FAILED (the message reaches the client)."""

    def run_into(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
        """Execute once, writing the named outputs into the given arrays (views of the
        client's shared memory) and returning those same arrays for them. Backends that
        can bind output buffers override this to avoid the copy."""
        outs = self.run(inputs)
        for name, dest in outputs.items():
            if name in outs and outs[name].shape == dest.shape:
                np.copyto(dest, outs[name], casting="no")
                outs[name] = dest
        return outs

    def bind(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
             ) -> Callable[[], dict[str, np.ndarray]] | None:
        """Optional: a run bound once to these arrays (a burst's fixed request: views of
        registered memory that stay mapped while the run is kept), which reads
        ``inputs`` as they are at each call, writes every output into ``outputs`` and
        returns a dict naming those same arrays. None (the default): ``run_into`` each
        time. A backend binds here what it would otherwise set up per run."""
        return None

    def abort(self) -> None:  # noqa: B027 - optional hook
        """Best effort: make a ``run`` in progress return early (cancel, revoke)."""

    def begin_step(self, effective_priority: int, background: bool) -> None:  # noqa: B027
        """Called on the thread that runs the next step, right before ``run``/``run_into``:
        the job's effective priority (HAL: lower = more important) and whether its
        execution class is BACKGROUND, for a backend whose priority knobs act per run (or
        per compiled variant). The default does nothing: the host's own thread class
        (drivers/classes.py) is all that reaches the machine."""

    def backend_state(self) -> dict[str, Any]:
        """What the backend was told for this model (knobs set, read back), for the
        host's ``device.stats``; {} when there is nothing to say."""
        return {}

    @abstractmethod
    def release(self) -> None:
        """Free the model's memory; no run follows."""

    def artifacts(self) -> tuple[list[bytes], list[bytes]]:
        """The model cache and data cache blobs to write (one per cache file).

        The default declines to cache; a driver that reports cache files overrides it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not produce cache artifacts")


class Driver(ABC):
    """A device driver loaded into a driver host process."""

    #: The HAL version this driver implements; must equal npud's.
    HAL_VERSION: ClassVar[int] = HAL_VERSION
    #: Whether ``compile`` resolves ONNX external data from ``CompileOptions.external_data``
    #: (models that have some are refused with InvalidArgument otherwise).
    accepts_external_data: ClassVar[bool] = False
    name: str = "driver"
    version: str = "0"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    @abstractmethod
    def capabilities(self) -> DriverCapabilities: ...

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        """(model cache files, data cache files); (0, 0) = no caching."""
        return 0, 0

    @abstractmethod
    def compile(self, onnx_bytes: bytes, options: CompileOptions) -> PreparedModel: ...

    def load_artifacts(
        self, model_blobs: list[bytes], data_blobs: list[bytes], options: CompileOptions
    ) -> PreparedModel:
        """Rebuild a model from verified cache blobs (called only after verification)."""
        raise NotImplementedError(f"{type(self).__name__} cannot prepare from cache")

    def temperature(self, now: float, utilization: float) -> float | None:
        """Advance the driver's thermal model to ``now`` given the channels' busy fraction
        since the last call; None if the driver has no thermal model."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend resources at host shutdown."""


def check_driver_class(name: str, cls: object) -> type[Driver]:
    """Refuse a plugin that does not speak our HAL or lacks a required method."""
    if not isinstance(cls, type):
        raise DriverRefused(f"driver {name!r}: entry point is {cls!r}, not a class")
    version = getattr(cls, "HAL_VERSION", None)
    if version != HAL_VERSION:
        raise DriverRefused(
            f"driver {name!r} ({cls.__module__}.{cls.__qualname__}) implements HAL version "
            f"{version!r}; npud speaks HAL version {HAL_VERSION}"
        )
    missing = []
    for meth, why in REQUIRED_DRIVER_METHODS.items():
        fn = getattr(cls, meth, None)
        if fn is None or not callable(fn) or getattr(fn, "__isabstractmethod__", False):
            missing.append(f"{meth}() [{why}]")
    if missing:
        raise DriverRefused(
            f"driver {name!r} ({cls.__module__}.{cls.__qualname__}) does not implement HAL "
            f"version {HAL_VERSION}: missing {', '.join(missing)}"
        )
    return cls


def check_driver_instance(name: str, driver: Driver) -> tuple[int, int]:
    """Checks that need an instance: cache file counts (NNAPI refuses > 32)."""
    try:
        counts = driver.get_number_of_cache_files_needed()
        n_model, n_data = (int(counts[0]), int(counts[1]))
    except Exception as exc:
        raise DriverRefused(
            f"driver {name!r}: get_number_of_cache_files_needed() failed: {exc}"
        ) from None
    for kind, n in (("model", n_model), ("data", n_data)):
        if not 0 <= n <= MAX_CACHE_FILES:
            raise DriverRefused(
                f"driver {name!r} needs {n} {kind} cache files; at most {MAX_CACHE_FILES} allowed"
            )
    return n_model, n_data


def check_prepared_model(name: str, model: object) -> None:
    missing = [m for m in REQUIRED_MODEL_METHODS if not callable(getattr(model, m, None))]
    if missing:
        raise DriverRefused(f"driver {name!r}: its prepared model lacks {', '.join(missing)}")


def load_driver_class(plugin: str) -> type[Driver]:
    """Find ``plugin`` in the entry-point group (or a ``module:Class`` path) and check it."""
    target: object
    if ":" in plugin:
        import importlib

        mod_name, _, attr = plugin.partition(":")
        try:
            target = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise DriverRefused(f"driver {plugin!r} cannot be imported: {exc}") from None
        return check_driver_class(plugin, target)
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == plugin]
    if not found:
        known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise DriverRefused(
            f"no driver plugin {plugin!r} in entry-point group {ENTRY_POINT_GROUP!r}"
            f"{suggest(plugin, known)} (installed: {', '.join(known) or 'none'})"
        )
    try:
        target = found[0].load()
    except Exception as exc:
        raise DriverRefused(f"driver {plugin!r} failed to import: {exc}") from None
    return check_driver_class(plugin, target)


def instantiate(plugin: str, options: dict[str, Any]) -> tuple[Driver, tuple[int, int]]:
    cls = load_driver_class(plugin)
    try:
        sig = inspect.signature(cls)
        driver = cls(options) if sig.parameters else cls()
    except DriverRefused:
        raise
    except Exception as exc:
        raise DriverRefused(f"driver {plugin!r} failed to start: {exc}") from None
    counts = check_driver_instance(plugin, driver)
    return driver, counts

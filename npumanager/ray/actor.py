"""Ray actors that serve a model under their node's npud.

Ray places work coarsely (custom resources per node, :mod:`npumanager.ray.resources`);
the node's npud decides who may hold the accelerator now. ``@npu_actor`` turns
a class into one whose constructor asks the local npud for a grant and
prepares the model (a :class:`~npumanager.ray.holder.ModelHolder`, ``self.npu``)
before the class's own ``__init__`` runs::

    @ray.remote(num_cpus=0, max_restarts=-1, resources={"npu:reference": 1})
    @npu_actor(model="embedder.onnx", on_unload="restart")
    class Embedder:
        def embed(self, x):
            return self.npu.execute({"x": x})["y"]

Its requests are BACKGROUND model priority unless the decorator says
otherwise, so a local foreground app always wins. When npud asks for the
accelerator back (PREEMPTED, THERMAL, ...) the actor drains its running
calls, releases the model, reports it unloaded and then

- ``on_unload="restart"``: ends its worker process (exit status 75), which
  Ray sees as a failure and answers with a restart (``max_restarts``). The
  restarted actor asks the npud of whatever node Ray picked; if that node
  still has no room it leaves again after ``grant_timeout_s``, so the actor
  walks to a node with room. (``ray.actor.exit_actor()`` would end it for
  good: Ray restarts only actors that die.)
- ``on_unload="wait"``: stays, asks again, and serves once npud grants again;
  calls meanwhile wait ``call_wait_s``, then raise ``DeviceUnavailable``.

Which npud: the ``runtime_dir`` argument, else the node's Ray label
``npu.runtime-dir`` (``ray start --labels npu.runtime-dir=/run/npu``), else the
worker's ``NPU_RUNTIME_DIR`` (``ray start`` passes its environment on), else
the default (``/run/npu`` as root).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from npumanager.constants import ModelPriority, ModelSize
from npumanager.ray.holder import HolderConfig, ModelHolder, ModelSource

log = logging.getLogger("npumanager.ray")

#: The exit status of an actor that leaves its node (EX_TEMPFAIL: try again elsewhere).
RESTART_EXIT_STATUS = 75
#: The Ray node label naming the node's npud runtime dir.
RUNTIME_DIR_LABEL = "npu.runtime-dir"

C = TypeVar("C", bound=type)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("npumanager.ray needs Ray: pip install 'npumanager[ray]'") from None
    return ray


def node_runtime_dir(explicit: str | os.PathLike[str] | None = None) -> str | None:
    """The runtime dir of this node's npud, as an actor on it should find it."""
    if explicit is not None:
        return os.fspath(explicit)
    try:
        ray = _ray()
        if ray.is_initialized():
            labels = ray.get_runtime_context().get_node_labels()
            if labels.get(RUNTIME_DIR_LABEL):
                return str(labels[RUNTIME_DIR_LABEL])
    except (ImportError, AttributeError):
        pass
    return os.environ.get("NPU_RUNTIME_DIR") or None


def _node_id() -> str:
    try:
        ray = _ray()
        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except (ImportError, AttributeError):
        pass
    return ""


def leave_node(why: str) -> None:
    """End this worker so Ray restarts the actor (it holds nothing of npud's any more)."""
    log.warning("npu actor leaves this node (%s); Ray restarts it", why)
    for h in logging.getLogger().handlers:
        h.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESTART_EXIT_STATUS)


def npu_actor(model: ModelSource, *, device: str = "reference",
              size: ModelSize = ModelSize.LESS_THAN_1GB,
              priority: ModelPriority = ModelPriority.BACKGROUND,
              importance: int | None = None, on_unload: str = "restart",
              cache_dir: str | None = None, token: bytes | None = None,
              runtime_dir: str | os.PathLike[str] | None = None,
              grant_timeout_s: float | None = 10.0, call_wait_s: float = 30.0,
              drain_s: float = 3.0, events_path: str | None = None
              ) -> Callable[[C], C]:
    """Class decorator: the actor holds ``model`` on ``device`` under its node's npud.

    The holder is ``self.npu`` (``self.npu.execute(inputs)``); ``npu_status()``
    is added as a method (node, state, grants, events). Apply ``@ray.remote``
    on top, with ``max_restarts`` for ``on_unload="restart"`` and the node
    resource (``resources={resource_name(device): 1}``) so Ray places it only
    on nodes that have the device."""
    cfg = HolderConfig(model=model, device=device, size=size, priority=priority,
                       importance=importance, on_unload=on_unload, cache_dir=cache_dir,
                       token=token, grant_timeout_s=grant_timeout_s, call_wait_s=call_wait_s,
                       drain_s=drain_s, events_path=events_path)

    def decorate(cls: C) -> C:
        user_init: Callable[..., None] = cls.__init__  # type: ignore[misc]

        # No functools.wraps: Ray inspects __wrapped__, which may be object.__init__.
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            self.npu = ModelHolder(cfg, node_runtime_dir(runtime_dir), node=_node_id(),
                                   on_leave=leave_node)
            self.npu.start()
            user_init(self, *args, **kwargs)

        def npu_status(self: Any) -> dict[str, Any]:
            """Where this actor runs and what npud let it do (for dashboards and tests)."""
            status: dict[str, Any] = self.npu.status()
            return status

        cls.__init__ = __init__  # type: ignore[misc]
        if not hasattr(cls, "npu_status"):
            cls.npu_status = npu_status  # type: ignore[attr-defined]
        cls.npu_config = cfg  # type: ignore[attr-defined]
        return cls

    return decorate


__all__ = ["RESTART_EXIT_STATUS", "RUNTIME_DIR_LABEL", "leave_node", "node_runtime_dir",
           "npu_actor"]

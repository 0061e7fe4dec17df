"""Ray workloads under each node's npud (extra ``npumanager[ray]``).

- :func:`npu_actor`: a class decorator for model-serving Ray actors that ask
  their node's npud for a grant, honour unload requests, and either wait for
  a new grant or leave so Ray restarts them elsewhere.
- :func:`node_resources`: the custom resources a node advertises to Ray
  (``python -m npumanager.ray resources`` prints them for ``ray start``).
- :class:`ModelHolder`: the part that does not need Ray (any long-lived server).

Ray itself is imported only when an actor starts, so this package imports
without it.
"""

from npumanager.ray.actor import (
    RESTART_EXIT_STATUS,
    RUNTIME_DIR_LABEL,
    leave_node,
    node_runtime_dir,
    npu_actor,
)
from npumanager.ray.holder import HolderConfig, ModelHolder
from npumanager.ray.resources import node_resources, resource_name

__all__ = [
    "RESTART_EXIT_STATUS",
    "RUNTIME_DIR_LABEL",
    "HolderConfig",
    "ModelHolder",
    "leave_node",
    "node_resources",
    "node_runtime_dir",
    "npu_actor",
    "resource_name",
]

"""What a node tells Ray about its accelerators: one custom resource per npud device.

``ray start --resources "$(python -m npumanager.ray resources)"`` (or
``ray.init(resources=node_resources())``) advertises ``{"npu:reference": n}``
for each available device of the node's npud, so Ray places NPU actors only
on nodes that have one. Ray's resources are logical and static: ``n`` is how
many NPU actors Ray may put on the node for that device (``slots``, default 1
each), not what they may hold. That stays npud's decision, made live, with
priorities, memory and temperature, which Ray knows nothing about.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

RESOURCE_PREFIX = "npu:"


def resource_name(device: str) -> str:
    """The Ray resource of a device: ``npu:reference``, ``npu:openvino:NPU``."""
    return RESOURCE_PREFIX + device


def node_resources(runtime_dir: str | os.PathLike[str] | None = None, *,
                   slots: int | Mapping[str, int] = 1) -> dict[str, float]:
    """``{resource_name(device): slots}`` for each available device of this node's npud.

    ``slots``: NPU actors Ray may place per device (one number, or per device
    name; a device left out of the mapping gets 1). Raises ServiceUnavailable
    when npud does not answer: a node without npud advertises nothing."""
    from npumanager.client import NpuManager

    with NpuManager(runtime_dir, client_name="ray-resources") as mgr:
        devices = mgr.devices()
    out: dict[str, float] = {}
    for d in devices:
        if not d.available:
            continue
        n = slots.get(d.name, 1) if isinstance(slots, Mapping) else slots
        if n > 0:
            out[resource_name(d.name)] = float(n)
    return out


__all__ = ["RESOURCE_PREFIX", "node_resources", "resource_name"]

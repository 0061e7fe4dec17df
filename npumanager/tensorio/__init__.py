"""Tensors between a client and a driver host: specs, codecs, shared-memory pools.

The neutral layer under both :mod:`npumanager.nn` (the client runtime) and
:mod:`npumanager.drivers` (the driver host): each imports this, never the other.
"""

from npumanager.tensorio.codec import (
    ALIGN,
    add_inline,
    align,
    check_dtype,
    dtype_name,
    inline_array,
    inline_msg,
    view_in,
)
from npumanager.tensorio.pools import ClientPool, MappedPool
from npumanager.tensorio.specs import TensorSpec

__all__ = [
    "ALIGN",
    "ClientPool",
    "MappedPool",
    "TensorSpec",
    "add_inline",
    "align",
    "check_dtype",
    "dtype_name",
    "inline_array",
    "inline_msg",
    "view_in",
]

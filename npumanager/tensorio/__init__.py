"""Values between a client and a driver host: specs, codecs, shared-memory pools.

The neutral layer under both :mod:`npumanager.nn` (the client runtime) and
:mod:`npumanager.drivers` (the driver host): each imports this, never the other.
"""

from npumanager.tensorio.codec import (
    ALIGN,
    add_inline,
    align,
    contiguous,
    fill_inline,
    inline_array,
    inline_msg,
    view_in,
)
from npumanager.tensorio.dtypes import check_dtype, dtype_name, is_numeric, is_string
from npumanager.tensorio.pools import ClientPool, MappedPool
from npumanager.tensorio.specs import (
    InputCheck,
    TensorSpec,
    ValueType,
    spec_from_msg,
    spec_to_msg,
)
from npumanager.tensorio.values import (
    decode_value,
    encode_tensor,
    encode_value,
    is_tensor,
    tensors_in,
)

__all__ = [
    "ALIGN",
    "ClientPool",
    "InputCheck",
    "MappedPool",
    "TensorSpec",
    "ValueType",
    "add_inline",
    "align",
    "check_dtype",
    "contiguous",
    "decode_value",
    "dtype_name",
    "encode_tensor",
    "encode_value",
    "fill_inline",
    "inline_array",
    "inline_msg",
    "is_numeric",
    "is_string",
    "is_tensor",
    "spec_from_msg",
    "spec_to_msg",
    "tensors_in",
    "view_in",
]

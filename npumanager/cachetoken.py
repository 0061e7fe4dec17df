"""What both ends of NNAPI compilation caching check: the token and the file counts.

The client derives the token (:mod:`npumanager.nn.token`) and names the files
(:mod:`npumanager.nn.cache_files`); the driver verifies (:mod:`npumanager.cache`,
:mod:`npumanager.drivers.cache_store`). Both check the same values here.
"""

from __future__ import annotations

from npumanager.errors import InvalidArgument

#: ANEURALNETWORKS_BYTE_SIZE_OF_CACHE_TOKEN.
BYTE_SIZE_OF_CACHE_TOKEN = 32
#: MAX_NUMBER_OF_CACHE_FILES: the limit for each kind of cache file.
MAX_NUMBER_OF_CACHE_FILES = 32


def check_token(token: object, what: str = "cache token") -> bytes:
    """``token`` as bytes if it is exactly 32 bytes; otherwise InvalidArgument."""
    if not isinstance(token, bytes | bytearray | memoryview):
        raise InvalidArgument(f"{what} must be bytes, not {type(token).__name__}")
    raw = bytes(token)
    if len(raw) != BYTE_SIZE_OF_CACHE_TOKEN:
        raise InvalidArgument(
            f"{what} must be exactly {BYTE_SIZE_OF_CACHE_TOKEN} bytes, got {len(raw)}"
        )
    return raw

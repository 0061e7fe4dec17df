"""The cache token the driver sees, derived as NNAPI's TokenHasher does.

The app's 32-byte token alone is not enough: the same app token must miss when
the device, its version, the execution preference, the priority or the
partitioning change, because the compiled artifact differs. So the token sent to
the driver is SHA-256 seeded with the app token, then the device name and
version string (without their NUL terminators), then the int32 preference, the
int32 priority and the int32 partitioning, each in little-endian (native order
on every platform NNAPI ships on).
"""

from __future__ import annotations

import hashlib
import struct

from npumanager.cachetoken import BYTE_SIZE_OF_CACHE_TOKEN, check_token
from npumanager.errors import InvalidArgument

_INT32 = struct.Struct("<i")


def _int32(value: int, name: str) -> bytes:
    try:
        return _INT32.pack(int(value))
    except struct.error as exc:
        raise InvalidArgument(f"{name} does not fit in an int32: {value!r}") from exc


def driver_token(
    app_token: bytes,
    device_name: str,
    device_version: str,
    preference: int,
    priority: int,
    partitioning: int = 0,
) -> bytes:
    """The 32-byte token the driver receives for this app token and compilation."""
    h = hashlib.sha256(check_token(app_token, "app cache token"))
    h.update(device_name.encode("utf-8"))
    h.update(device_version.encode("utf-8"))
    h.update(_int32(preference, "preference"))
    h.update(_int32(priority, "priority"))
    h.update(_int32(partitioning, "partitioning"))
    return h.digest()


__all__ = ["BYTE_SIZE_OF_CACHE_TOKEN", "check_token", "driver_token"]

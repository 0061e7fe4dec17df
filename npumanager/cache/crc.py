"""CRC32C as nnCache computes it: Castagnoli polynomial (reflected 0x82F63B78),
initial value 0 and no final XOR.

That is not the standard CRC-32C (which starts from and XORs with 0xFFFFFFFF),
so the ``crc32c`` package's result is adjusted: starting it from ``~0`` makes
its internal register start at 0, and XORing its output with ``~0`` undoes its
final XOR. Without the package a table-driven implementation is used; both are
checked against the same vectors in the tests.
"""

from __future__ import annotations

from types import ModuleType

_POLY = 0x82F63B78
_MASK = 0xFFFFFFFF


def _make_table() -> list[int]:
    table = []
    for i in range(256):
        r = i
        for _ in range(8):
            r = (r >> 1) ^ _POLY if r & 1 else r >> 1
        table.append(r)
    return table


_TABLE = _make_table()


def crc32c_nn_table(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """Table-driven nnCache CRC32C (slow; the fallback)."""
    r = crc
    table = _TABLE
    for b in memoryview(data).cast("B"):
        r = table[(r ^ b) & 0xFF] ^ (r >> 8)
    return r


_crc32c_pkg: ModuleType | None
try:
    import crc32c as _crc32c_pkg
except ImportError:  # pragma: no cover - the package is a dependency
    _crc32c_pkg = None


def crc32c_nn(data: bytes | bytearray | memoryview) -> int:
    """nnCache's CRC32C of ``data`` (init 0, no final XOR)."""
    if _crc32c_pkg is None:  # pragma: no cover
        return crc32c_nn_table(data)
    return int(_crc32c_pkg.crc32c(data, _MASK)) ^ _MASK


__all__ = ["crc32c_nn", "crc32c_nn_table"]

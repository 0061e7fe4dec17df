"""Cache file names and opening, exactly as the NNAPI runtime does it.

A cache entry is ``n_model`` model-cache files and ``n_data`` data-cache files in
the app's cache directory. Each name is 64 letters spelling the token (for each
byte, ``'A' + low nibble`` then ``'A' + high nibble``), then ``'1'`` for model
cache or ``'2'`` for data cache, then the decimal index. The files are opened
read+write with mode 0600; the load path never creates them, so a missing file
is a miss rather than an empty entry.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from npumanager.cachetoken import MAX_NUMBER_OF_CACHE_FILES, check_token
from npumanager.errors import InvalidArgument
from npumanager.fds import close_fds

CACHE_FILE_MODE = 0o600


def token_string(token: bytes) -> str:
    """The 64 letters NNAPI derives from a 32-byte token."""
    raw = check_token(token)
    return "".join(chr(ord("A") + (b & 0x0F)) + chr(ord("A") + (b >> 4)) for b in raw)


def _check_count(n: int, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_NUMBER_OF_CACHE_FILES:
        raise InvalidArgument(
            f"number of {what} cache files must be 0..{MAX_NUMBER_OF_CACHE_FILES}, got {n!r}"
        )
    return n


def cache_file_names(
    cache_dir: str | os.PathLike[str], token: bytes, n_model: int, n_data: int
) -> tuple[list[str], list[str]]:
    """The model-cache and data-cache paths NNAPI would use for ``token`` in ``cache_dir``."""
    directory = os.fspath(cache_dir)
    if not directory:
        raise InvalidArgument("cache_dir must not be empty")
    # ANeuralNetworksCompilation_setCaching appends '/' when the app left it out.
    if not directory.endswith("/"):
        directory += "/"
    base = directory + token_string(token)
    model = [f"{base}1{i}" for i in range(_check_count(n_model, "model"))]
    data = [f"{base}2{i}" for i in range(_check_count(n_data, "data"))]
    return model, data


def open_cache_files(paths: Sequence[str | os.PathLike[str]], create: bool) -> list[int] | None:
    """Open every path O_RDWR (mode 0600 when created); None if any cannot be opened.

    ``create=False`` is the load path: it never creates a file, so a missing one
    makes the whole entry a miss. On any failure the fds opened so far are closed.
    """
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, flags, CACHE_FILE_MODE))
    except OSError:
        close_fds(fds)
        return None
    return fds


__all__ = [
    "CACHE_FILE_MODE",
    "MAX_NUMBER_OF_CACHE_FILES",
    "cache_file_names",
    "open_cache_files",
    "token_string",
]

"""What the torch driver reads: an app's ``.pt2`` program, and its own AOTInductor packages.

Both are zip archives, and both are dangerous to open carelessly:

- A ``torch.export.save`` archive may hold pickles: tensors with
  ``use_pickle``, opaque and torchbind constants, legacy ``.pt`` weights,
  and sample inputs that ``torch.export.load`` retries with
  ``weights_only=False``. Any of them runs code in the driver. It may also
  carry compiled AOTInductor code (a shared library) of the app's making.
  :func:`vet_exported_program` refuses all of that before ``torch`` sees the
  archive: only raw tensor payloads and JSON pass, and the sample inputs must
  load with ``weights_only=True`` (so the unsafe retry never happens).
- An AOTInductor package contains a shared library, which the loader can only
  take from a path. :func:`write_private_copy` writes the (already verified)
  bytes to a fresh file in the driver's private directory (0700; unique name;
  ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600) and the loader reads that file,
  never the app's. :func:`check_package_names` refuses entry names that could
  lead the loader's extraction out of its directory.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import zipfile
from pathlib import Path, PurePosixPath

from npumanager.errors import GeneralFailure, InvalidArgument

#: Bounds on an app's archive (entries, bytes of one JSON config).
MAX_ENTRIES = 100_000
MAX_JSON_BYTES = 64 << 20
_PICKLED_CONSTANT_PREFIXES = ("custom_obj_", "opaque_obj_")


def _zip(data: bytes, what: str, error: type[Exception]) -> zipfile.ZipFile:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise error(f"{what} is not a zip archive: {exc}") from None
    if len(archive.infolist()) > MAX_ENTRIES:
        raise error(f"{what} has more than {MAX_ENTRIES} entries")
    return archive


def _relative(name: str) -> str | None:
    """The entry's path below the archive's top folder; None if it is unsafe."""
    p = PurePosixPath(name)
    if p.is_absolute() or "\\" in name or any(part in ("..", "") for part in p.parts):
        return None
    return "/".join(p.parts[1:])


def vet_exported_program(data: bytes) -> None:
    """InvalidArgument unless ``data`` is a ``torch.export.save`` archive without pickles
    or compiled code (see the module docstring)."""
    archive = _zip(data, "the model", InvalidArgument)
    names: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        rel = _relative(info.filename)
        if rel is None:
            raise InvalidArgument(f"the model has an unsafe entry name {info.filename!r}")
        names[rel] = info
    if not any(n.startswith("models/") and n.endswith(".json") for n in names):
        raise InvalidArgument("not a torch.export program (no models/*.json): save it with "
                              "torch.export.save")
    for rel, info in names.items():
        if rel.startswith("data/aotinductor/"):
            raise InvalidArgument("the model carries compiled AOTInductor code; send the "
                                  "torch.export program, the driver compiles it")
        if rel.startswith("data/weights/") and rel.endswith(".pt"):
            raise InvalidArgument(f"legacy pickled weights {rel!r} are refused")
        if rel.endswith("_config.json") and rel.startswith(("data/weights/", "data/constants/")):
            _check_payload_config(archive, info, rel)
        if rel.startswith("data/sample_inputs/"):
            _check_sample_inputs(archive.read(info), rel)


def _check_payload_config(archive: zipfile.ZipFile, info: zipfile.ZipInfo, rel: str) -> None:
    if info.file_size > MAX_JSON_BYTES:
        raise InvalidArgument(f"{rel} is too large")
    try:
        config = json.loads(archive.read(info))
        entries = config["config"].items()
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidArgument(f"{rel} is not a payload config") from None
    for fqn, meta in entries:
        if not isinstance(meta, dict):
            raise InvalidArgument(f"{rel}: entry {fqn!r} is malformed")
        path_name = str(meta.get("path_name", ""))
        if meta.get("use_pickle") or path_name.startswith(_PICKLED_CONSTANT_PREFIXES):
            raise InvalidArgument(
                f"{rel}: {fqn!r} is pickled; only plain tensors are accepted (a pickle "
                "would run code in the driver)"
            )


def _check_sample_inputs(blob: bytes, rel: str) -> None:
    import torch

    try:
        torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as exc:
        raise InvalidArgument(f"{rel} does not load with weights_only=True: {exc}") from None


def check_package_names(package: bytes) -> None:
    """GeneralFailure unless ``package`` is a zip whose entries stay inside its folder and
    which holds an AOTInductor model."""
    archive = _zip(package, "the cached package", GeneralFailure)
    rels = [_relative(i.filename) for i in archive.infolist()]
    if any(r is None for r in rels):
        raise GeneralFailure("the cached package has an unsafe entry name")
    if not any(r is not None and r.startswith("data/aotinductor/model/") for r in rels):
        raise GeneralFailure("the cached package holds no AOTInductor model")


def write_private_copy(directory: Path, data: bytes, suffix: str = ".pt2") -> Path:
    """``data`` in a new file of ``directory`` (which must be ours and 0700), mode 0600.

    The name is random and the file is created exclusively, without following a
    link, so nothing can be waiting at that path; nobody else can write there.
    """
    st = os.lstat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not os.path.isdir(directory):
        raise GeneralFailure(f"{directory} is not a private directory of uid {os.getuid()}")
    path = directory / f"{secrets.token_hex(16)}{suffix}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return path


__all__ = ["check_package_names", "vet_exported_program", "write_private_copy"]

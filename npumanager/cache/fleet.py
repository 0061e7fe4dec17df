"""The fleet cache tier's keys and signed entries (pure: no network, no files but key files).

A fleet of identical machines compiles the same models; a builder compiles
once, signs the artifact with its Ed25519 key and publishes it (Redis, see
:mod:`npumanager.cache.fleet_store`); every node verifies the signature with
the builder's public key, which it was configured to trust, before anything
of the entry reaches a backend. The store itself is never trusted: whoever
can write to it can plant bytes, but not sign them.

Key: what makes a compiled artifact reusable on another machine, and nothing
else (an omission here is a stale hit on the wrong machine): the backend
(driver plugin) and its version, the device the artifact was compiled for
(with the CPU's vector extensions for CPU backends: an optimized ONNX Runtime
graph may use a layout blocked for AVX-512), the BLAKE3 hash of the model
bytes, and the compile options (NNAPI preference and priority, the driver's
cache file counts). :meth:`FleetKey.digest` hashes their canonical JSON.

Entry (all integers big-endian)::

    magic "NPUFLT1\\n" | key id (16) | header length (u32) | header (JSON)
    | Ed25519 signature (64) | model blobs, then data blobs, back to back

The signature covers a domain string, the magic, the key id, the length and
the header; the header names the key fields, and the size and BLAKE3 hash of
every blob. So verifying costs one signature check over a small header plus
one BLAKE3 pass over the blobs (~GB/s), not an Ed25519 pass over gigabytes.
:func:`open_entry` refuses, with the reason, an entry that is truncated or has
bytes past its end, an unknown key id, a bad signature, key fields other
than the ones asked for, or a blob whose hash differs.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from npumanager.errors import InvalidArgument

MAGIC = b"NPUFLT1\n"
FORMAT = 1
_DOMAIN = b"npumanager/fleet-entry/v1\0"
_KEY_DOMAIN = b"npumanager/fleet-key/v1\0"
_PREFIX = struct.Struct(">8s16sI")  # magic, key id, header length
SIGNATURE_BYTES = 64
KEY_ID_BYTES = 16
#: A header longer than this is refused before it is even looked at.
MAX_HEADER_BYTES = 64 * 1024
#: Blobs per kind an entry may hold (NNAPI's MAX_NUMBER_OF_CACHE_FILES).
MAX_BLOBS = 32


class FleetRefused(Exception):
    """An entry that must not be used; ``reason`` says why (it is logged, then a miss)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# --- keys ---------------------------------------------------------------------------


def model_hash(model: bytes | bytearray | memoryview) -> str:
    """The BLAKE3 hash (hex) of a model's bytes, as fleet keys carry it."""
    return blake3.blake3(model, max_threads=blake3.blake3.AUTO).hexdigest()


@dataclass(frozen=True)
class FleetKey:
    """What a compiled artifact is for. Values are strings; options are sorted pairs."""

    backend: str
    backend_version: str
    device: str
    model_hash: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def for_model(cls, backend: str, backend_version: str, device: str,
                  model: bytes | bytearray | memoryview,
                  options: Mapping[str, object] | None = None) -> FleetKey:
        return cls(backend, backend_version, device, model_hash(model),
                   tuple(sorted((str(k), str(v)) for k, v in (options or {}).items())))

    def fields(self) -> dict[str, Any]:
        return {"backend": self.backend, "backend_version": self.backend_version,
                "device": self.device, "model_hash": self.model_hash,
                "options": dict(self.options)}

    @classmethod
    def from_fields(cls, fields: object) -> FleetKey:
        """The key an entry's header names; FleetRefused if it is malformed."""
        if not isinstance(fields, dict):
            raise FleetRefused("entry header has no key")
        try:
            opts = fields["options"]
            if not isinstance(opts, dict):
                raise TypeError
            key = cls(fields["backend"], fields["backend_version"], fields["device"],
                      fields["model_hash"], tuple(sorted(opts.items())))
        except (KeyError, TypeError):
            raise FleetRefused("entry header has a malformed key") from None
        if not all(isinstance(v, str) for v in (key.backend, key.backend_version, key.device,
                                                key.model_hash)) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in key.options):
            raise FleetRefused("entry header has a malformed key")
        return key

    def digest(self) -> str:
        """A hex name for the key (the store's key name is a prefix plus this)."""
        return blake3.blake3(_KEY_DOMAIN + _canonical(self.fields())).hexdigest()

    def describe(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        return (f"{self.backend} {self.backend_version} [{self.device}] "
                f"model {self.model_hash[:12]}… ({opts})")


def cpu_features() -> str:
    """The CPU's vector extensions that change what an optimizing compiler emits.

    Part of the device of CPU backends' keys: an artifact compiled on an AVX-512
    builder must not be handed to an AVX2 node. Only extensions that matter to
    code generation are kept, sorted, so identical machines agree."""
    wanted = {
        "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
        "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile",
        "amx_bf16", "amx_int8",  # x86-64
        "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16", "fphp", "asimdhp",  # aarch64
    }
    found: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    found.update(value.split())
                    break
    except OSError:
        pass
    return f"{platform.machine()}:{'+'.join(sorted(found & wanted)) or 'baseline'}"


# --- keys for signing ----------------------------------------------------------------


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the [fleet] extra is missing
        raise InvalidArgument(
            "the fleet cache tier needs the 'cryptography' package: "
            "pip install 'npumanager[fleet]'") from None
    return ed25519


def key_id(public_key: Any) -> bytes:
    """The 16-byte id of an Ed25519 public key (BLAKE3 of its raw bytes)."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return blake3.blake3(b"npumanager/fleet-key-id\0" + raw).digest()[:KEY_ID_BYTES]


class SigningKey:
    """A builder's Ed25519 private key."""

    def __init__(self, private_key: Any) -> None:
        self.private_key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    def __repr__(self) -> str:
        return f"<SigningKey {self.key_id.hex()}>"

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(_ed25519().Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        """A PEM (PKCS#8) Ed25519 private key, e.g. ``openssl genpkey -algorithm ed25519``."""
        from cryptography.hazmat.primitives import serialization

        ed = _ed25519()
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"cannot read signing key {path}: {exc.strerror}") from None
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"signing key {path} is not a PEM private key: {exc}"
                                  ) from None
        if not isinstance(key, ed.Ed25519PrivateKey):
            raise InvalidArgument(f"signing key {path} is not an Ed25519 key")
        return cls(key)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the private key (PEM, mode 0600) and ``PATH.pub`` (the public key, PEM)."""
        from cryptography.hazmat.primitives import serialization

        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        pub = Path(f"{os.fspath(path)}.pub")
        pub.write_bytes(public_pem(self.public_key))
        return pub

    def sign(self, message: bytes) -> bytes:
        sig: bytes = self.private_key.sign(message)
        return sig


def public_pem(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = public_key.public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


class TrustedKeys:
    """The public keys whose signatures a node accepts, by key id."""

    def __init__(self, public_keys: Iterable[Any] = ()) -> None:
        self._keys: dict[bytes, Any] = {}
        for pk in public_keys:
            self._keys[key_id(pk)] = pk

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"<TrustedKeys {', '.join(k.hex() for k in self._keys) or 'none'}>"

    def get(self, kid: bytes) -> Any | None:
        return self._keys.get(kid)

    @classmethod
    def load(cls, specs: Sequence[str]) -> TrustedKeys:
        """From config entries: a path to a PEM public key, or ``ed25519:BASE64`` (raw 32 bytes).

        InvalidArgument names the entry that cannot be used."""
        from cryptography.hazmat.primitives import serialization

        ed = _ed25519()
        keys: list[Any] = []
        for spec in specs:
            if not isinstance(spec, str) or not spec:
                raise InvalidArgument(f"trusted key {spec!r}: a path or 'ed25519:BASE64'")
            if spec.startswith("ed25519:"):
                try:
                    raw = base64.b64decode(spec[len("ed25519:"):], validate=True)
                    keys.append(ed.Ed25519PublicKey.from_public_bytes(raw))
                except (ValueError, TypeError):
                    raise InvalidArgument(
                        f"trusted key {spec!r}: not 32 base64-encoded bytes") from None
                continue
            try:
                data = Path(spec).read_bytes()
            except OSError as exc:
                raise InvalidArgument(f"trusted key {spec}: {exc.strerror}") from None
            try:
                pk = serialization.load_pem_public_key(data)
            except (ValueError, TypeError):
                raise InvalidArgument(f"trusted key {spec}: not a PEM public key") from None
            if not isinstance(pk, ed.Ed25519PublicKey):
                raise InvalidArgument(f"trusted key {spec}: not an Ed25519 key")
            keys.append(pk)
        return cls(keys)


def raw_public_key(public_key: Any) -> str:
    """``ed25519:BASE64`` for a public key (a trusted_keys entry that needs no file)."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + base64.b64encode(raw).decode()


# --- entries --------------------------------------------------------------------------


@dataclass(frozen=True)
class Artifact:
    """A verified entry: the blobs, and who signed them when."""

    key: FleetKey
    model_blobs: list[bytes]
    data_blobs: list[bytes]
    key_id: str
    created: int
    builder: str

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.model_blobs)) + sum(map(len, self.data_blobs))


def _blob_list(blobs: Sequence[bytes | bytearray | memoryview]) -> list[list[Any]]:
    return [[len(b), blake3.blake3(b, max_threads=blake3.blake3.AUTO).hexdigest()]
            for b in blobs]


def _signed_part(kid: bytes, header: bytes) -> bytes:
    return _PREFIX.pack(MAGIC, kid, len(header)) + header


def seal_entry(key: FleetKey, model_blobs: Sequence[bytes | bytearray | memoryview],
               data_blobs: Sequence[bytes | bytearray | memoryview], signer: SigningKey,
               *, builder: str | None = None, created: int | None = None) -> bytes:
    """The signed entry for ``key`` holding these blobs."""
    if not model_blobs:
        raise InvalidArgument("an entry needs at least one model blob")
    if len(model_blobs) > MAX_BLOBS or len(data_blobs) > MAX_BLOBS:
        raise InvalidArgument(f"at most {MAX_BLOBS} blobs of each kind")
    header = _canonical({
        "format": FORMAT,
        "key": key.fields(),
        "model": _blob_list(model_blobs),
        "data": _blob_list(data_blobs),
        "created": int(time.time()) if created is None else created,
        "builder": builder if builder is not None else platform.node(),
    })
    if len(header) > MAX_HEADER_BYTES:
        raise InvalidArgument("entry header too large")
    signed = _signed_part(signer.key_id, header)
    sig = signer.sign(_DOMAIN + signed)
    return b"".join([signed, sig, *(bytes(b) for b in model_blobs),
                     *(bytes(b) for b in data_blobs)])


def _sizes(header: dict[str, Any], kind: str) -> list[tuple[int, str]]:
    items = header.get(kind)
    if not isinstance(items, list) or len(items) > MAX_BLOBS:
        raise FleetRefused(f"entry header lists no valid {kind} blobs")
    out: list[tuple[int, str]] = []
    for item in items:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int)
                or isinstance(item[0], bool) or item[0] < 0 or not isinstance(item[1], str)):
            raise FleetRefused(f"entry header has a malformed {kind} blob")
        out.append((item[0], item[1]))
    return out


def open_entry(data: bytes | bytearray | memoryview, expected: FleetKey,
               trusted: TrustedKeys) -> Artifact:
    """The verified artifact in ``data``, or FleetRefused with the reason.

    Order matters: nothing of the header is interpreted before its signature
    checked out against a trusted key; nothing of the blobs is handed out
    before each one's hash matched the signed header."""
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size + SIGNATURE_BYTES:
        raise FleetRefused(f"truncated entry ({len(view)} bytes)")
    magic, kid, hlen = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise FleetRefused("not a fleet entry (bad magic)")
    if hlen > MAX_HEADER_BYTES:
        raise FleetRefused(f"entry header of {hlen} bytes is too large")
    body = _PREFIX.size + hlen + SIGNATURE_BYTES
    if len(view) < body:
        raise FleetRefused(f"truncated entry ({len(view)} bytes, header needs {body})")
    public_key = trusted.get(kid)
    if public_key is None:
        raise FleetRefused(f"signed by unknown key {kid.hex()}")
    signed = bytes(view[: _PREFIX.size + hlen])
    sig = bytes(view[_PREFIX.size + hlen : body])
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(sig, _DOMAIN + signed)
    except InvalidSignature:
        raise FleetRefused(f"bad signature (key {kid.hex()})") from None
    try:
        header = json.loads(signed[_PREFIX.size:])
    except ValueError:
        raise FleetRefused("entry header is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise FleetRefused("entry has an unknown format")
    key = FleetKey.from_fields(header.get("key"))
    if key != expected:
        raise FleetRefused(f"entry is for another key ({key.describe()})")
    model, blobs_data = _sizes(header, "model"), _sizes(header, "data")
    if not model:
        raise FleetRefused("entry has no model blob")
    total = sum(n for n, _ in model) + sum(n for n, _ in blobs_data)
    if len(view) - body != total:
        raise FleetRefused(f"entry holds {len(view) - body} blob bytes, its header says {total}")
    out: list[bytes] = []
    pos = body
    for n, digest in (*model, *blobs_data):
        blob = view[pos : pos + n]
        if blake3.blake3(blob, max_threads=blake3.blake3.AUTO).hexdigest() != digest:
            raise FleetRefused(f"blob {len(out)} does not match its signed hash")
        out.append(bytes(blob))
        pos += n
    created = header.get("created")
    builder = header.get("builder")
    return Artifact(key, out[: len(model)], out[len(model):], kid.hex(),
                    created if isinstance(created, int) else 0,
                    builder if isinstance(builder, str) else "")


__all__ = [
    "MAGIC",
    "Artifact",
    "FleetKey",
    "FleetRefused",
    "SigningKey",
    "TrustedKeys",
    "cpu_features",
    "key_id",
    "model_hash",
    "open_entry",
    "public_pem",
    "raw_public_key",
    "seal_entry",
]

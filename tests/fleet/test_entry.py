"""Fleet entries: keys, Ed25519 signatures, and every way an entry is refused."""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("cryptography", reason="the [fleet] extra (cryptography) is not installed")

from npumanager.cache import fleet
from npumanager.cache.fleet import (
    FleetKey,
    FleetRefused,
    SigningKey,
    TrustedKeys,
    open_entry,
    seal_entry,
)
from npumanager.errors import InvalidArgument

MODEL = b"\x08\x07" + b"onnx bytes" * 50


@pytest.fixture(scope="module")
def signer() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="module")
def trusted(signer: SigningKey) -> TrustedKeys:
    return TrustedKeys([signer.public_key])


def _key(**kw: object) -> FleetKey:
    base: dict[str, object] = dict(backend="reference", backend_version="1.0+ort1.20",
                                   device="onnxruntime CPU|x86_64:avx2", model=MODEL,
                                   options={"preference": 1, "priority": 100})
    base.update(kw)
    return FleetKey.for_model(str(base["backend"]), str(base["backend_version"]),
                              str(base["device"]), base["model"],  # type: ignore[arg-type]
                              base["options"])  # type: ignore[arg-type]


def _entry(signer: SigningKey, key: FleetKey | None = None) -> bytes:
    return seal_entry(key or _key(), [b"model-cache" * 100], [b"\x00\x01weights" * 1000],
                      signer, builder="builder-a", created=1_700_000_000)


def test_round_trip_gives_the_blobs_and_who_signed(signer: SigningKey,
                                                   trusted: TrustedKeys) -> None:
    art = open_entry(_entry(signer), _key(), trusted)
    assert art.model_blobs == [b"model-cache" * 100]
    assert art.data_blobs == [b"\x00\x01weights" * 1000]
    assert art.key_id == signer.key_id.hex()
    assert (art.builder, art.created) == ("builder-a", 1_700_000_000)


def test_several_blobs_and_empty_ones_keep_their_order(signer: SigningKey,
                                                       trusted: TrustedKeys) -> None:
    entry = seal_entry(_key(), [b"m0", b"", b"m2"], [b"d0", b"d1"], signer)
    art = open_entry(entry, _key(), trusted)
    assert art.model_blobs == [b"m0", b"", b"m2"] and art.data_blobs == [b"d0", b"d1"]


def test_key_fields_all_change_the_digest() -> None:
    base = _key()
    others = [_key(backend="openvino"), _key(backend_version="1.1"), _key(device="x86_64:avx512"),
              _key(model=MODEL + b"!"), _key(options={"preference": 0, "priority": 100}),
              _key(options={"preference": 1, "priority": 100, "n_data": 2})]
    digests = {k.digest() for k in [base, *others]}
    assert len(digests) == len(others) + 1
    # Option order does not matter: the key is canonical.
    assert _key(options={"priority": 100, "preference": 1}).digest() == base.digest()


def test_unknown_key_is_refused(signer: SigningKey) -> None:
    with pytest.raises(FleetRefused, match="unknown key"):
        open_entry(_entry(signer), _key(), TrustedKeys([SigningKey.generate().public_key]))


def test_signature_by_another_key_under_a_trusted_key_id_is_refused(
        signer: SigningKey, trusted: TrustedKeys) -> None:
    forger = SigningKey.generate()
    entry = bytearray(seal_entry(_key(), [b"evil"], [], forger))
    entry[8:24] = signer.key_id  # claim to be the trusted builder
    with pytest.raises(FleetRefused, match="bad signature"):
        open_entry(bytes(entry), _key(), trusted)


def test_entry_for_another_model_is_refused(signer: SigningKey, trusted: TrustedKeys) -> None:
    """A correctly signed entry moved under another key (Redis rename) is no hit."""
    entry = _entry(signer, _key(model=b"another model"))
    with pytest.raises(FleetRefused, match="another key"):
        open_entry(entry, _key(), trusted)


@pytest.mark.parametrize("field", ["backend", "backend_version", "device", "options"])
def test_wrong_key_fields_are_refused(signer: SigningKey, trusted: TrustedKeys,
                                      field: str) -> None:
    other = {"backend": _key(backend="torch"), "backend_version": _key(backend_version="9"),
             "device": _key(device="aarch64:sve"),
             "options": _key(options={"preference": 2, "priority": 100})}[field]
    with pytest.raises(FleetRefused, match="another key"):
        open_entry(_entry(signer, other), _key(), trusted)


def test_every_flipped_byte_is_refused(signer: SigningKey, trusted: TrustedKeys) -> None:
    entry = seal_entry(_key(), [b"m" * 40], [b"d" * 40], signer)
    for i in range(len(entry)):
        bad = bytearray(entry)
        bad[i] ^= 0x40
        with pytest.raises(FleetRefused):
            open_entry(bytes(bad), _key(), trusted)


def test_every_truncation_and_any_trailing_byte_is_refused(signer: SigningKey,
                                                           trusted: TrustedKeys) -> None:
    entry = seal_entry(_key(), [b"m" * 40], [b"d" * 40], signer)
    for n in range(len(entry)):
        with pytest.raises(FleetRefused):
            open_entry(entry[:n], _key(), trusted)
    with pytest.raises(FleetRefused, match="blob bytes"):
        open_entry(entry + b"\x00", _key(), trusted)


def test_garbage_is_refused_with_a_reason(trusted: TrustedKeys) -> None:
    for junk, why in [(b"", "truncated"), (b"x" * 200, "bad magic"),
                      (fleet.MAGIC + b"\x00" * 16 + struct.pack(">I", 1 << 30) + b"\x00" * 64,
                       "too large")]:
        with pytest.raises(FleetRefused, match=why):
            open_entry(junk, _key(), trusted)


def test_unsigned_entry_is_refused(trusted: TrustedKeys) -> None:
    """An entry whose signature bytes are zeros (someone wrote it without a key)."""
    entry = bytearray(_entry(SigningKey.generate()))
    hlen = struct.unpack_from(">I", entry, 24)[0]
    sig_at = 28 + hlen
    entry[sig_at : sig_at + 64] = bytes(64)
    with pytest.raises(FleetRefused):
        open_entry(bytes(entry), _key(), trusted)


def test_keys_load_from_pem_files_and_raw_form(tmp_path: object, signer: SigningKey) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "builder.pem"
    pub = signer.save(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    loaded = SigningKey.load(path)
    assert loaded.key_id == signer.key_id
    t1 = TrustedKeys.load([str(pub)])
    t2 = TrustedKeys.load([fleet.raw_public_key(signer.public_key)])
    entry = _entry(loaded)
    assert open_entry(entry, _key(), t1).key_id == open_entry(entry, _key(), t2).key_id


def test_bad_key_config_names_the_entry(tmp_path: object) -> None:
    from pathlib import Path

    junk = Path(str(tmp_path)) / "junk.pem"
    junk.write_text("not a key")
    for spec, why in [(str(junk), "not a PEM public key"), ("ed25519:AAAA", "32 base64"),
                      ("/nonexistent/key.pem", "No such file"), ("", "a path or")]:
        with pytest.raises(InvalidArgument, match=why):
            TrustedKeys.load([spec])
    with pytest.raises(InvalidArgument, match="not a PEM private key"):
        SigningKey.load(junk)


def test_cpu_features_are_stable_and_name_the_machine() -> None:
    import platform

    a, b = fleet.cpu_features(), fleet.cpu_features()
    assert a == b and a.startswith(platform.machine() + ":")

"""`npu cache ls|verify|gc|clear` against a real map and real cache files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from npumanager.cli.main import main
from npumanager.drivers.cache_store import DriverCache
from npumanager.fds import close_fds
from npumanager.nn.cache_files import cache_file_names, open_cache_files

TOKENS = [bytes([i]) * 32 for i in range(1, 4)]


@pytest.fixture
def populated(state_dir: Path, tmp_path: Path) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    cache = DriverCache("reference", "drv-1", 1, 1, state_root=state_dir)
    for i, t in enumerate(TOKENS):
        m, d = cache_file_names(app, t, 1, 1)
        fds = open_cache_files(m + d, create=True)
        assert fds is not None
        # The files are this process's, so the entries are its uid's (as the driver records
        # an app's entries under the uid that opened them).
        assert cache.save(t, fds[:1], fds[1:], [b"model%d" % i], [b"weights" * (i + 1)],
                          uid=os.getuid())
        close_fds(fds)
    cache.close()
    (app / "unrelated.txt").write_text("keep me")
    return app


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["cache", *argv])
    return rc, capsys.readouterr().out


def test_ls(populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run(capsys, "ls", "--state-dir", str(state_dir), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["driver_version"] == "drv-1"
    assert {e["token"] for e in doc["entries"]} == {t.hex() for t in TOKENS}
    assert all(e["hits"] == 0 and e["model_files"] == 1 for e in doc["entries"])
    rc, out = run(capsys, "ls", "--state-dir", str(state_dir))
    assert rc == 0 and "3 entries" in out and TOKENS[0].hex()[:16] in out


def test_verify_reports_damage(
    populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["verify", "--state-dir", str(state_dir), "--dir", str(populated)]
    rc, out = run(capsys, *base, "--json")
    assert rc == 0 and [r["status"] for r in json.loads(out)] == ["ok"] * 3
    m, _ = cache_file_names(populated, TOKENS[1], 1, 1)
    with open(m[0], "r+b") as f:
        f.write(b"X")
    rc, out = run(capsys, *base, "--json")
    assert rc == 1
    bad = [r for r in json.loads(out) if r["status"] != "ok"]
    assert [r["token"] for r in bad] == [TOKENS[1].hex()[:16]]
    rc, out = run(capsys, *base)
    assert rc == 1 and "DAMAGED" in out
    # verify never counts hits nor changes the map
    rc, out = run(capsys, "ls", "--state-dir", str(state_dir), "--json")
    assert all(e["hits"] == 0 for e in json.loads(out)["entries"])


def test_gc_applies_the_bound_and_removes_orphans(
    populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = run(
        capsys, "gc", "--state-dir", str(state_dir), "--max-entries", "1",
        "--dir", str(populated), "--json",
    )  # fmt: skip
    assert rc == 0 and json.loads(out) == {"evicted": 2, "files_removed": 4, "bound": 1}
    assert len(os.listdir(populated)) == 3  # one entry's two files + unrelated.txt


def test_clear_with_dir(
    populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = run(capsys, "clear", "--state-dir", str(state_dir), "--dir", str(populated))
    assert rc == 0 and "cleared 3 entries; removed 6 cache files" in out
    assert os.listdir(populated) == ["unrelated.txt"]
    rc, out = run(capsys, "ls", "--state-dir", str(state_dir), "--json")
    assert json.loads(out)["entries"] == []


def test_one_of_each_is_said_in_the_singular(
    populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A count meets its noun by one rule (npumanager.words): each verb said '1 entries'."""
    sd = ["--state-dir", str(state_dir)]
    rc, out = run(capsys, "gc", *sd, "--max-entries", "1")
    assert rc == 0 and "evicted 2 entries (bound 1); removed 0 orphaned files" in out, out
    rc, out = run(capsys, "ls", *sd)
    assert rc == 0 and "1 entry in" in out and "entries" not in out, out
    rc, out = run(capsys, "verify", *sd)
    assert rc == 0 and "is sound (1 entry)" in out, out
    rc, out = run(capsys, "verify", *sd, "--dir", str(populated))
    assert rc == 0 and "1 entry with files in" in out, out
    rc, out = run(capsys, "gc", *sd, "--max-entries", "1", "--dir", str(populated))
    assert rc == 0 and "evicted 0 entries (bound 1); removed 4 orphaned files" in out, out
    rc, out = run(capsys, "clear", *sd, "--dir", str(populated))
    assert rc == 0 and "cleared 1 entry; removed 2 cache files" in out, out


def test_a_damaged_map_is_said_and_clear_moves_it_aside(
    populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A map SQLite cannot read kept its driver from caching anything, and every verb said
    '(nothing cached yet?)', ls, gc and clear with exit 0: now each names it damaged and
    fails, and clear moves it aside so that the driver's next save starts a new one."""
    from npumanager.cache.verifier import DB_NAME, verifier_dir

    path = verifier_dir("reference", state_dir) / DB_NAME
    path.write_bytes(b"garbage, not SQLite" * 10)
    sd = ["--state-dir", str(state_dir)]
    for verb in ("ls", "verify", "gc"):
        rc = main(["cache", verb, *sd])
        err = capsys.readouterr().err
        assert rc == 1 and "the map is damaged" in err and "`npu cache clear` moves it aside" \
            in err and "nothing cached yet" not in err, (verb, err)
    rc, out = run(capsys, "clear", *sd)
    assert rc == 0 and f"the map {path} was damaged (file is not a database): moved it to " \
        f"{path}.damaged-" in out, out
    assert [p.name.startswith(f"{DB_NAME}.damaged-") for p in path.parent.iterdir()] == [True]
    cache = DriverCache("reference", "drv-1", 1, 1, state_root=state_dir)  # the driver's next
    m, d = cache_file_names(populated, TOKENS[0], 1, 1)
    fds = open_cache_files(m + d, create=False)
    assert fds is not None
    assert cache.save(TOKENS[0], fds[:1], fds[1:], [b"m"], [b"w"], uid=os.getuid())
    close_fds(fds)
    cache.close()
    rc, out = run(capsys, "ls", *sd)
    assert rc == 0 and "1 entry in" in out, out


def test_a_map_no_driver_has_written_yet_is_empty_not_damaged(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty map file (created, never written): ls titled it 'reference ()' and verify
    called it damaged ('the hashing key is missing'), though its driver keys it at its first
    save and caches as usual. A map with entries and no key is still damaged."""
    from npumanager.cache.verifier import DB_NAME, verifier_dir

    path = verifier_dir("reference", state_dir) / DB_NAME
    path.parent.mkdir(parents=True, mode=0o700)
    path.touch(mode=0o600)
    sd = ["--state-dir", str(state_dir)]
    rc, out = run(capsys, "ls", *sd)
    assert rc == 0 and "reference (no driver has written it yet): 0 entries" in out, out
    rc, out = run(capsys, "verify", *sd)
    assert rc == 0 and "is sound (0 entries)" in out, out


def test_no_map_yet(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "ls", "--state-dir", str(state_dir)]) == 0
    assert "no cache map" in capsys.readouterr().err
    assert not (state_dir / "drivers").exists()  # looking created nothing


def test_cli_never_resets_the_map(
    populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, "ls", "--state-dir", str(state_dir))
    cache = DriverCache("reference", "drv-1", 1, 1, state_root=state_dir)
    try:
        assert len(cache.verifier.entries()) == 3
    finally:
        cache.close()


def test_verify_without_dir_checks_the_map(
    populated: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = run(capsys, "verify", "--state-dir", str(state_dir))
    assert rc == 0 and "is sound (3 entries)" in out and "--dir DIR" in out
    rc, out = run(capsys, "verify", "--state-dir", str(state_dir), "--json")
    assert rc == 0 and json.loads(out)["ok"] is True
    # A map whose file is not a database any more is reported, exit 1, no traceback.
    from npumanager.cache.verifier import DB_NAME, verifier_dir

    db = verifier_dir("reference", state_dir) / DB_NAME
    data = bytearray(db.read_bytes())
    data[:16] = b"not a database!!"
    db.write_bytes(bytes(data))
    for name in (DB_NAME + "-wal", DB_NAME + "-shm"):
        (db.parent / name).unlink(missing_ok=True)
    try:
        rc = main(["cache", "verify", "--state-dir", str(state_dir)])
    except SystemExit as exc:  # pragma: no cover - would be a bug
        raise AssertionError(exc) from None
    out, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in err, (out, err)


@pytest.mark.parametrize("verb", ["ls", "verify", "gc", "clear"])
def test_a_dir_that_is_not_there_is_named(populated: Path, state_dir: Path, verb: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --dir was read as a clean one ('0 entries with files in DIR, 0 damaged',
    exit 0); now one line, exit 2, and the map is left as it was."""
    typo = populated.parent / "apps"
    rc = main(["cache", verb, "--state-dir", str(state_dir), "--dir", str(typo)])
    err = capsys.readouterr().err
    assert (rc, err) == (2, f"npu cache: --dir {typo}: no such directory (an app's cache "
                            "directory)\n")
    rc, out = run(capsys, "ls", "--state-dir", str(state_dir), "--json")
    assert len(json.loads(out)["entries"]) == 3

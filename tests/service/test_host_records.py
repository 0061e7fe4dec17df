"""npud's record of the hosts it started (service/host_records.py): what ties an adopted
host to it, and each thing that breaks the tie. Real processes and files; the attacks
under other uids (a recycled pid, another process at the socket) are in
tests/security/test_host_rt_adopted.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from npumanager.service import host_records as hr
from npumanager.testing import procs


def _park() -> None:
    procs.receive(timeout=30)


def test_a_record_ties_the_process_it_was_written_for(tmp_path: Path) -> None:
    path = hr.record_path(tmp_path / "reference.sock")
    assert path == tmp_path / "reference.host"
    child = procs.spawn_as(None, None, _park)
    try:
        assert hr.write(path, child.pid, os.getuid()) == ""
        assert oct(path.stat().st_mode & 0o777) == "0o644"
        rec = hr.adopt(path, child.pid, os.getuid())
        assert isinstance(rec, hr.HostRecord) and rec.pid == child.pid
        assert rec.start == hr.start_time(child.pid) and rec.boot == hr.boot_id() != ""
        assert hr.check(rec, child.pid) == ""
        # The supervisor's way in: the driver's user from [manager] driver_user.
        assert hr.tie(path, child.pid, {"driver_user": str(os.getuid())}) == rec
        if os.getuid() == 0:
            no = hr.tie(path, child.pid, {"driver_user": "no-such-user-here"})
            assert "does not exist" in str(no)
        # Another process (this one), another user, another boot: no tie.
        assert "is not the host npud started" in hr.check(rec, os.getpid())
        assert "not the driver's user" in str(hr.adopt(path, child.pid, os.getuid() + 1))
        other_boot = dataclasses.replace(rec, boot="0" * 32)
        assert "another boot" in hr.check(other_boot, child.pid)
        # The same pid, another start time: what a recycled pid looks like.
        assert "recycled pid" in hr.check(dataclasses.replace(rec, start=rec.start - 1),
                                          child.pid)
        child.send("done")
        child.wait(10)
    finally:
        child.kill()
    assert "has exited" in hr.check(rec, child.pid)
    hr.remove(path)
    assert "no record" in str(hr.adopt(path, child.pid, os.getuid()))


def test_a_record_npud_cannot_trust_is_none(tmp_path: Path) -> None:
    path = tmp_path / "x.host"
    good = {"format": 1, "pid": os.getpid(), "start": hr.start_time(os.getpid()),
            "uid": os.getuid(), "boot": hr.boot_id()}
    path.write_text(json.dumps(good))
    path.chmod(0o644)
    assert isinstance(hr.read(path), hr.HostRecord)
    path.chmod(0o666)
    assert "writable by others" in str(hr.read(path))
    for bad in ("{", "[]", json.dumps({**good, "format": 2}), json.dumps({"format": 1})):
        path.write_text(bad)
        path.chmod(0o644)
        assert isinstance(hr.read(path), str), bad
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.host")
    (tmp_path / "elsewhere.host").write_text(json.dumps(good))
    assert "cannot read" in str(hr.read(path))  # (O_NOFOLLOW)


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_a_record_of_another_owner_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.host"
    assert hr.write(path, os.getpid(), 0) == ""
    os.chown(path, 50001, 50001)
    assert "not a file of npud's" in str(hr.read(path))

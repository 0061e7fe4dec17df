"""Attack 2: cross-uid cache poisoning. The driver's map was keyed by token alone: uid B
compiled its own model under uid A's token, swapped its files into a directory A uses (a
shared or careless one) and A's next prepare reported ``loaded_from_cache`` and ran B's
model; B could also flush A's entries out of the LRU by recording tokens.

Now the map is keyed by (uid, token), the uid being SO_PEERCRED's: B's files verify only
as B's entry, so A misses and compiles its own model; and a uid's records evict only its
own entries ([cache] max_entries_per_uid)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.nn.cache_files import cache_file_names
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, granted
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root

pytestmark = needs_root

TOKEN = bytes(range(32))


@pytest.fixture
def shared() -> Iterator[Path]:
    """A careless cache directory: anyone may write (and rename) in it."""
    d = Path(tempfile.mkdtemp(prefix="npu-shared-", dir="/tmp"))
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


def prepare_cached(runtime_dir: str, cache_dir: str, bias: float, token: bytes = TOKEN
                   ) -> tuple[bool, list[float]]:
    """As an app: prepare y = x + bias with NNAPI caching; (loaded_from_cache, y)."""
    with granted(runtime_dir) as (dev, grant):
        model = dev.prepare_model(add_model(4, bias), grant=grant, cache_dir=cache_dir,
                                  token=token)
        try:
            return model.loaded_from_cache, model.execute({"x": X})["y"].ravel().tolist()
        finally:
            model.release()


def poison(runtime_dir: str, own_dir: str, victim_dir: str) -> list[str]:
    """As the attacker: compile a model of its own under the victim's token in its own dir,
    then move those (genuine) files over the victim's."""
    os.makedirs(own_dir, exist_ok=True)
    prepare_cached(runtime_dir, own_dir, 100.0)
    moved = []
    for name in os.listdir(own_dir):
        os.replace(os.path.join(own_dir, name), os.path.join(victim_dir, name))
        moved.append(name)
    return moved


def flood(runtime_dir: str, own_dir: str, n: int) -> list[bool]:
    os.makedirs(own_dir, exist_ok=True)
    return [prepare_cached(runtime_dir, own_dir, 100.0, bytes([0xB0, i]) + bytes(30))[0]
            for i in range(n)]


def test_another_uids_files_under_the_victims_token_never_run_for_the_victim(
        start_npud: StartDaemon, runtime_dir: Path, shared: Path) -> None:
    start_npud(drivers=True)
    rt = str(runtime_dir)
    assert procs.run_as(BYSTANDER, None, prepare_cached, rt, str(shared), 1.0,
                        timeout=60) == (False, [1.0, 2.0, 3.0, 4.0])
    assert procs.run_as(BYSTANDER, None, prepare_cached, rt, str(shared), 1.0,
                        timeout=60)[0] is True
    moved = procs.run_as(ATTACKER, None, poison, rt, str(shared / "attacker"), str(shared),
                         timeout=60)
    assert len(moved) == 2 and all(os.stat(shared / n).st_uid == ATTACKER for n in moved)
    assert sorted(moved) == sorted(os.path.basename(p) for ps in cache_file_names(
        shared, _driver_token(runtime_dir), 1, 1) for p in ps)
    # The victim misses and compiles its own model: never the attacker's y = x + 100.
    got = procs.run_as(BYSTANDER, None, prepare_cached, rt, str(shared), 1.0, timeout=60)
    assert got == (False, [1.0, 2.0, 3.0, 4.0]), got
    assert_device_served(runtime_dir)


def test_a_uid_flooding_tokens_evicts_only_its_own_entries(
        start_npud: StartDaemon, runtime_dir: Path, shared: Path) -> None:
    start_npud(drivers=True, cache={"max_entries": 8, "max_entries_per_uid": 2})
    rt = str(runtime_dir)
    victim = shared / "victim"
    victim.mkdir()
    os.chown(victim, BYSTANDER, BYSTANDER)
    assert procs.run_as(BYSTANDER, None, prepare_cached, rt, str(victim), 1.0,
                        timeout=60)[0] is False
    hits = procs.run_as(ATTACKER, None, flood, rt, str(shared / "attacker"), 6, timeout=120)
    assert hits == [False] * 6
    got = procs.run_as(BYSTANDER, None, prepare_cached, rt, str(victim), 1.0, timeout=60)
    assert got == (True, [1.0, 2.0, 3.0, 4.0]), "the attacker's records evicted the victim's"
    assert_device_served(runtime_dir)


def _driver_token(runtime_dir: Path) -> bytes:
    from npumanager import nn
    from npumanager.nn.token import driver_token

    dev = nn.device("reference", runtime_dir)
    try:
        return driver_token(TOKEN, dev.name, dev.version, 1, 100)
    finally:
        dev.close()

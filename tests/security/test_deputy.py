"""Attack 1: the confused deputy. A model whose tensor names a file (``etc/shadow``
relative to the driver's working directory, ``../../…``, the driver's own state) made the
root driver read it and hand its bytes back as an output.

Now the driver opens no path an app named: the client opens a model's external data with
the app's own rights and sends fds, and the driver refuses any reference it was not sent
(InvalidArgument naming the tensor and the location), wherever the tensor hides. The
legitimate use keeps working: weights in the app's private directory, which the driver's
user cannot even read, reach the driver as the fds the app sent."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.testing import procs
from npumanager.testing.external_models import PLACES, referencing_model
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import prepare_outcomes, private_external_model
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root

pytestmark = needs_root


@pytest.fixture
def secret() -> Iterator[Path]:
    """A root-only file (0600 in a 0700 dir) the attacker wants."""
    d = Path(tempfile.mkdtemp(prefix="npu-secret-", dir="/tmp"))
    f = d / "shadow"
    f.write_bytes(b"\x00\x00\x80\x3f" * 4)  # four float32 1.0: would come back as y = x + 1
    os.chmod(f, 0o600)
    try:
        yield f
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


def test_a_model_naming_a_root_only_file_is_refused_wherever_the_tensor_hides(
        start_npud: StartDaemon, runtime_dir: Path, state_dir: Path, secret: Path) -> None:
    start_npud(drivers=True)
    up = "../" * 16  # out of the driver's working directory, whatever it is
    locations = [up + str(secret).lstrip("/"), str(secret), "etc/shadow",
                 up + str(state_dir / "drivers/reference/cache/cache-map.sqlite3").lstrip("/")]
    models: list[bytes | str] = [referencing_model(loc) for loc in locations]
    models += [referencing_model(locations[0], where) for where in PLACES[1:]]
    got = procs.run_as(ATTACKER, None, prepare_outcomes, str(runtime_dir), models, timeout=60)
    for i, out in enumerate(got):
        loc = locations[i] if i < len(locations) else locations[0]
        assert out.startswith(f"InvalidArgument: tensor 'W' refers to external data '{loc}', "
                              "which the client did not send: a driver never opens a path "
                              "named inside a model"), (i, out)
    assert_device_served(runtime_dir)


def test_weights_in_an_apps_private_dir_reach_the_driver_as_fds(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    home = Path(tempfile.mkdtemp(prefix="npu-app-", dir="/tmp"))
    os.chmod(home, 0o755)
    os.chown(home, BYSTANDER, BYSTANDER)
    try:
        # The app's 0700 directory: the driver's user cannot even look inside.
        out = procs.run_as(BYSTANDER, None, private_external_model, str(runtime_dir),
                           str(home / "private"), timeout=60)
        assert out == [0.5, 3.5, 6.5, 9.5], out
        assert os.stat(home / "private").st_uid == BYSTANDER
        weights = home / "private" / "m" / "weights.bin"
        assert procs.run_as(65534, None, _can_read, str(weights)) is False
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=False)
    assert_device_served(runtime_dir)


def _can_read(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except PermissionError:
        return False

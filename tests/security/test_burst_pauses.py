"""Attack 9b (pauses): a hostile app paces its burst in phrases to buy the most polling.

With ``burst_anticipate_pauses`` on (the default, voice30), a pause of at least
``PAUSE`` periods between two phrases of a paced stream keeps the pace the driver learnt,
so a voice assistant's phrases (requests 30 ms apart, then silence) are anticipated
(drivers/anticipate.py). A phrase's end costs the driver one window that no request comes
in. The attacker (another uid) makes that as often as it can: phrases of two requests
and a pause of 4 periods, so every second window it is planned waits for nothing, every
one of them opening just before another uid's requests at the same pace (through the
real SDK). What is checked, under real uids: the attacker's pace was learnt through its
pauses (windows were planned for it: the bound was exercised, and without the key none
are); every window planned for either burst is at most the configured one, and each poll
within it plus the bounded allowances; no more windows than requests; the other uid's
stream was not starved of anticipation (the poll slot in turns, drivers/poll_turns.py)
and every answer of both is its own correct output; the device serves a third uid after.
No wall-clock limits: counts and outputs are compared."""

from __future__ import annotations

from pathlib import Path

from npumanager.drivers.anticipate import PAUSE
from tests.security.conftest import StartDaemon
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root
from tests.security.test_burst_stamps import (
    MAX_SKIPPED_RUN,
    VICTIM_CALLS,
    paced,
    planned_windows,
    poll_turns,
    race,
)

pytestmark = needs_root

#: The attacker's phrases: requests in the first PHRASE of every CYCLE of the victim's
#: slots (a pause of CYCLE - PHRASE + 1 periods, above PAUSE), at the victim's own times
#: (lag 0: the attacker's windows, and its windows that wait for nothing, open just
#: before the victim's requests).
PHRASE, CYCLE = 2, 5
ATTACKER_BIAS = 1.0
SLOTS = [i for i in range(VICTIM_CALLS) if i % CYCLE < PHRASE]
assert CYCLE - PHRASE + 1 > PAUSE


def test_phrases_buy_no_more_than_a_window_per_request(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    mine, theirs, bursts = race(start_npud, runtime_dir, paced, SLOTS, ATTACKER_BIAS, 1, 0.0,
                                served=len(SLOTS))
    assert theirs == {"wrong": [], "served": VICTIM_CALLS}, theirs
    assert mine == {"wrong": [], "served": len(SLOTS)}, mine
    planned = planned_windows(bursts)
    # The attacker's pace was learnt across its pauses (without burst_anticipate_pauses
    # none is), and it got at most a window per request.
    assert 1 <= planned[ATTACKER] <= len(SLOTS), planned
    by_uid = {b["uid"]: b for b in bursts}
    took, skipped, run = poll_turns(by_uid[BYSTANDER])
    assert took >= 1 and took >= skipped / 3 and run <= MAX_SKIPPED_RUN, (took, skipped, run)
    assert_device_served(runtime_dir)

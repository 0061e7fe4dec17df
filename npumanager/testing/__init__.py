"""Test fakes that ship with the product: a virtual clock, a scriptable driver,
a fake thermal zone directory, helpers to run a daemon and client processes
under other uids, and the HAL conformance suite."""

from npumanager.testing.clock import VirtualClock

__all__ = ["VirtualClock"]

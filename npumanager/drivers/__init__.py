"""npumanager.drivers."""

"""npumanager.nn."""

"""npumanager.thermal."""

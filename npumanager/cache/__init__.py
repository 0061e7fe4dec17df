"""npumanager.cache."""

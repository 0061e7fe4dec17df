"""npumanager.client."""

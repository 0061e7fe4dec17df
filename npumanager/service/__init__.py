"""npud: the "npu" system service (policy authority; never executes models)."""

"""The `npu` command line."""

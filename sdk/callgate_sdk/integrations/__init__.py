"""Adapters for agent frameworks; each needs its optional extra (see sdk/README.md)."""

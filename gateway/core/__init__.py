"""Pure scheduling policy: no I/O, no clock, no randomness of its own (import-linter and tests/core/test_purity.py)."""

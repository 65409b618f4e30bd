"""Pure scheduling policy: workflows, estimates, budgets, dispatchers, queue disciplines, scheduler.

Nothing here performs I/O, reads a clock or creates randomness; time and the RNG are arguments. Import-linter
contracts (``pyproject.toml``) and ``tests/core/test_purity.py`` keep it that way.
"""

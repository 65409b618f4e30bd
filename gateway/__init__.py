"""HexGen-Flow: a heterogeneity- and deadline-aware inference gateway for agentic Text-to-SQL.

Packages:
    gateway.core  pure scheduling policy (no I/O, no clock, no RNG of its own)
    gateway.sim   discrete-event simulator of a heterogeneous vLLM cluster, alpha tuner, benchmarks
"""

__version__ = "0.1.0"

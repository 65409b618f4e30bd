"""Tools over the two drivers: simulated and live benchmarks, trace replay, the overhead bench, the
emulator load bench, the Text-to-SQL demo and evaluation runners, reports and plots. Nothing in the server
imports this package.

Shared by the tools: ``stats`` (percentile, number format, the one text table) and ``procs`` (the child
processes they start: an emulated cluster, a gateway, with their config files and free ports).
"""

"""Tools over the two drivers: simulated and live benchmarks, trace replay, the overhead bench, the
Text-to-SQL demo and evaluation runners, reports and plots. Nothing in the server imports this package."""

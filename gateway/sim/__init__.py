"""Discrete-event simulator of a heterogeneous vLLM cluster, workloads, alpha tuner and benchmarks."""

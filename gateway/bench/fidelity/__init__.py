"""Does the profile predict the worker? ``hexflow bench fidelity`` (``emulated``), ``bench fidelity-vllm``
(``vllm``: real vLLM on the CPU), ``bench open-loop`` (``openloop``) and ``calibrate --check-interleaved``
(``interleave``), sharing ``gateway.profiling`` and ``compare``."""

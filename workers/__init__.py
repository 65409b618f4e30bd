"""Workers the gateway talks to: an emulated vLLM worker (a test double for a GPU) and launch recipes
for real vLLM servers. The emulator runs the same ``PerfProfile`` model as the simulator."""

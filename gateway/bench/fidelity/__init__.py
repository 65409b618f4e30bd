"""Does the profile predict the worker? One command family, four modes, one core.

* ``hexflow bench fidelity`` (``emulated``): emulated workers of unknown speed are calibrated
  (``gateway.profiling``), a trace is replayed live through the gateway, and the simulator predicts it with
  the calibrated profiles.
* ``hexflow bench fidelity-vllm`` (``vllm``, ``vllm_servers``, ``breakdown``, ``vllm_report``): the same
  against real vLLM servers on the CPU, with what the gap is made of.
* ``hexflow bench open-loop`` (``openloop``): a workload's calls sent open loop to one worker, each against
  the profile's simulated engine.
* ``hexflow calibrate --check-interleaved N`` (``interleave``): staggered requests right after a fit, each
  against the fitted profile's simulated engine.

The shared core: ``gateway.profiling`` probes and calibrates, ``gateway.profiling.worker.send_arrivals``
sends a timed stream of requests to one worker, ``compare.simulate_arrivals`` predicts the same stream on
one simulated engine, ``compare.live_gaps`` compares a live replay with its simulation, and
``compare.work_folder`` keeps each run's logs and catalogues.
"""

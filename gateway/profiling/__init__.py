"""Measuring a worker's performance profile: the tools apart from the serving path.

``hexflow calibrate`` probes a live OpenAI-compatible worker with a short, bounded plan and fits the
profile the simulator and the scheduler use (``plan``: the probes and their model; ``worker``: the HTTP
side; ``probe``: the calibration run and its result; ``output``: the written profile and the report);
``promparse`` parses a worker's ``/metrics`` (the calibration's back-off and KV capacity, the live
gateway's scraper). Sits above ``sim``, ``config`` and ``core`` and below ``live``, ``bench`` and ``cli``.
"""

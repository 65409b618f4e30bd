"""The one description of a worker, from configuration to scheduler.

``WorkerInfo`` is built in one place (``gateway.config.cluster.make_worker``: for the workers of a
cluster file and for the pods that discovery finds) and passed along unchanged: the scheduler and its
estimator read the profile and the capacity from it, the simulator its engine model, the live pool
and transport its address. It is immutable; a worker's capacity changes only through
``Scheduler.set_capacity`` and its profile only through ``Scheduler.set_profile`` (the online refit),
each of which puts a new ``WorkerInfo`` in the worker's slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.profile import PerfProfile


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker: its name, performance profile and in-flight limit, and where it is (live only).

    Attributes:
        name: unique among the current workers (metric label, status pages, logs).
        profile: the engine's performance model (GPU type, model, timing constants).
        capacity: calls the gateway keeps in flight on the worker at once (at least 1).
        url: base URL of the worker's OpenAI-compatible server; empty when the worker has no address
            (the simulator).
        served_model: the model name requests to the worker carry; empty in the simulator.
        profile_source: where the profile's constants come from: ``catalogue`` (the GPU catalogue's
            entry for the GPU type), ``file`` (a profile named from ``profiles_file``, e.g. written by
            ``hexflow calibrate``) or ``refit`` (fitted online to the worker's completed calls).
    """

    name: str
    profile: PerfProfile
    capacity: int
    url: str = ""
    served_model: str = ""
    profile_source: str = "catalogue"

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"worker {self.name!r}: capacity must be at least 1, got {self.capacity}")

"""The one description of a worker, from configuration to scheduler.

``WorkerInfo`` is built by ``gateway.config.cluster.make_worker`` and immutable: its capacity and profile
change only through ``Scheduler.set_capacity`` / ``set_profile``, which put a new one in the worker's slot."""

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
        url: base URL of the worker's OpenAI-compatible server (empty in the simulator).
        served_model: the model name requests to the worker carry (empty in the simulator).
        profile_source: ``catalogue`` (the GPU type's entry), ``file`` (from ``profiles_file``, e.g. written
            by ``hexflow calibrate``) or ``refit`` (fitted online).
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

"""The one description of a worker, from configuration to scheduler (immutable: the scheduler replaces it)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.profile import PerfProfile


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker: its unique name, performance profile, in-flight limit, and where it is (live only).
    ``profile_source``: ``catalogue``, ``file`` (``profiles_file``) or ``refit``."""

    name: str
    profile: PerfProfile
    capacity: int
    url: str = ""
    served_model: str = ""
    profile_source: str = "catalogue"

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"worker {self.name!r}: capacity must be at least 1, got {self.capacity}")

"""The one description of a worker, from configuration to scheduler (immutable: the scheduler replaces it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.core.profile import PerfProfile

Role = Literal["colocated", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("colocated", "prefill", "decode")
"""Under prefill/decode disaggregation (``gateway.core.transfer``): ``colocated`` runs whole calls (vLLM as usual);
``prefill`` only split calls' prompts; ``decode`` split calls' decodes after their KV arrived, and whole calls."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker: its unique name, performance profile, in-flight limit, and where it is (live only).
    ``profile_source``: ``catalogue``, ``file`` (``profiles_file``) or ``refit``. ``role``: what it runs under
    prefill/decode disaggregation; ``node``: the machine it shares links with (empty: none);
    ``kv_bytes_per_token``: its model's KV cache per token (0: unknown, its calls are never split)."""

    name: str
    profile: PerfProfile
    capacity: int
    url: str = ""
    served_model: str = ""
    profile_source: str = "catalogue"
    role: Role = "colocated"
    node: str = ""
    kv_bytes_per_token: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"worker {self.name!r}: capacity must be at least 1, got {self.capacity}")
        if self.role not in ROLES:
            raise ValueError(f"worker {self.name!r}: role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.kv_bytes_per_token < 0:
            raise ValueError(f"worker {self.name!r}: kv_bytes_per_token must be >= 0, got {self.kv_bytes_per_token}")

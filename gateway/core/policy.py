"""Named scheduling policies: a dispatcher plus a queue discipline, each standing for a real system.

==========  ==========  ==========  =================================================================
policy      dispatcher  queue       stands for
==========  ==========  ==========  =================================================================
hexgen      wb          urgency     HexGen-Flow: workload-balanced heterogeneity-aware dispatch and
                                    urgency-driven per-worker queues with stage budgets
wb-fcfs     wb          fcfs        the paper's ablation without the priority queue
rr-pq       rr          urgency     the paper's ablation without the workload-balanced dispatcher
rr-fcfs     rr          fcfs        vLLM replicas behind a round-robin load balancer (the paper's
                                    baseline)
p2c-fcfs    p2c         fcfs        Ray Serve's power-of-two-choices request router
lw-fcfs     lw          fcfs        least predicted outstanding work: AIBrix least-busy-time, llm-d
                                    load-aware scorer; the strongest simple baseline
llf         lw          llf         least laxity first on the end-to-end deadline, load-aware dispatch
edf         lw          edf         earliest deadline first, load-aware dispatch
vtc         lw          vtc         virtual token counter fair share across tenants (Sheng et al.)
==========  ==========  ==========  =================================================================

The deadline-aware and fairness baselines use the strongest dispatcher (``lw``) so that they are
compared on their queue discipline, not handicapped by round-robin.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.dispatch import DISPATCHERS
from gateway.core.queues import QUEUES
from gateway.errors import UnknownNameError


@dataclass(frozen=True)
class Policy:
    """A named bundle of a dispatcher and a queue discipline."""

    name: str
    dispatcher: str
    queue: str
    system: str
    default_alpha: float = 0.0

    @property
    def uses_alpha(self) -> bool:
        """True when the dispatcher reads alpha (so the tuner has something to tune)."""
        return self.dispatcher == "wb"


POLICIES: dict[str, Policy] = {}


def register_policy(policy: Policy) -> None:
    """Register a policy; a duplicate name or an unknown dispatcher/queue raises."""
    if policy.name in POLICIES:
        raise ValueError(f"policy {policy.name!r} already registered")
    if policy.dispatcher not in DISPATCHERS:
        raise UnknownNameError("dispatcher", policy.dispatcher, list(DISPATCHERS))
    if policy.queue not in QUEUES:
        raise UnknownNameError("queue discipline", policy.queue, list(QUEUES))
    POLICIES[policy.name] = policy


def get_policy(name: str) -> Policy:
    """The registered policy ``name``; unknown names raise ``UnknownNameError``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownNameError("policy", name, list(POLICIES)) from None


for _p in (
    Policy("hexgen", "wb", "urgency", "HexGen-Flow (WB dispatch + urgency queues)", default_alpha=0.3),
    Policy("wb-fcfs", "wb", "fcfs", "HexGen-Flow ablation: no priority queue", default_alpha=0.3),
    Policy("rr-pq", "rr", "urgency", "HexGen-Flow ablation: no WB dispatcher"),
    Policy("rr-fcfs", "rr", "fcfs", "vLLM behind a round-robin load balancer"),
    Policy("p2c-fcfs", "p2c", "fcfs", "Ray Serve power-of-two-choices router"),
    Policy("lw-fcfs", "lw", "fcfs", "AIBrix least-busy-time / llm-d load-aware (least outstanding work)"),
    Policy("llf", "lw", "llf", "least laxity first on the end-to-end deadline"),
    Policy("edf", "lw", "edf", "earliest deadline first"),
    Policy("vtc", "lw", "vtc", "virtual token counter fair share across tenants"),
):
    register_policy(_p)

"""Named scheduling policies: a dispatcher plus a queue discipline, each standing for a real system, with a role
(``ours``, ``baseline``, ``ablation``: docs/architecture.md, "Policies and the WB score"). An ablation runs
only behind the benchmark switch (``production_policy``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from gateway.core.dispatchers import Capabilities, get_dispatcher
from gateway.core.queues import QUEUES
from gateway.errors import UnknownName

Role = Literal["ours", "baseline", "ablation"]
"""What a policy is in a comparison (module docstring)."""

AdmissionStyle = Literal["predictive", "saturation", "queue"]
"""How a policy's system admits work under overload: ours predicts each workflow's completion
(``gateway.core.admission.Admitter``); llm-d's flow control sheds sheddable requests while the pool is saturated
(``SaturationGate``); the others refuse at a queue length (``QueueGate``, the live ``limits.max_queued_calls``)."""

PRODUCTION_ROLES: tuple[Role, ...] = ("ours", "baseline")
"""The roles a deployment may run without the benchmark switch (``production_policy``)."""


@dataclass(frozen=True)
class Policy:
    """A named bundle of a dispatcher and a queue discipline, and its role in comparisons."""

    name: str
    dispatcher: str
    queue: str
    system: str
    role: Role
    default_alpha: float = 0.0
    prefix_aware: bool = False
    """The scheduler tracks which prompt prefixes each worker holds (``gateway.core.prefix.PrefixIndex``) and
    counts cached tokens out of the call's prefill on each worker (only where the engines cache prefixes)."""
    prefix_credit: float = 1.0
    """How many times their own prefill a call's cached tokens are worth when the dispatcher compares workers."""
    admission: AdmissionStyle = "queue"
    """How the system the policy stands for admits work under overload (``gateway.core.admission``)."""
    split_threshold: int | None = None
    """Prefill/decode disaggregation as llm-d's pd-profile-handler does it: the decode worker is chosen first (among
    ``decode`` and ``colocated`` workers); a call whose prompt, less what that worker holds, exceeds this many
    tokens has its prefill on a ``prefill`` worker (chosen by the same dispatcher), when there is one. None: never
    split (``prefill`` workers then run nothing)."""
    split_predicted: bool = False
    """Prefill/decode disaggregation from the latency model: with the decode worker chosen as for a whole call, a
    call is split onto a ``prefill`` worker when its predicted completion there (the prefill worker's queue and
    prompt time, the KV transfer, the decode alone) plus the delay its prompt imposes on the calls running there
    beats the whole call's on the decode worker (``Scheduler.submit``)."""

    @property
    def capabilities(self) -> Capabilities:
        """What the policy's dispatcher reads (``gateway.core.dispatchers.Capabilities``)."""
        return get_dispatcher(self.dispatcher).capabilities

    @property
    def uses_alpha(self) -> bool:
        """True when the dispatcher reads alpha (so the tuner has something to tune)."""
        return self.capabilities.uses_alpha


POLICIES: dict[str, Policy] = {}


def register_policy(policy: Policy) -> None:
    """Register a policy; a duplicate name, an unknown dispatcher/queue or an unknown role raises, and so does a
    policy that is not prefix-aware over a dispatcher that reads the prefix index."""
    if policy.name in POLICIES:
        raise ValueError(f"policy {policy.name!r} already registered")
    if policy.role not in get_args(Role):
        raise ValueError(f"policy {policy.name!r}: role must be one of {get_args(Role)}, got {policy.role!r}")
    caps = get_dispatcher(policy.dispatcher).capabilities
    if caps.prefix_index and not policy.prefix_aware:
        raise ValueError(f"policy {policy.name!r}: dispatcher {policy.dispatcher!r} reads the prefix index")
    if policy.queue not in QUEUES:
        raise UnknownName("queue discipline", policy.queue, list(QUEUES))
    POLICIES[policy.name] = policy


def policies_with_role(role: Role) -> list[str]:
    """Names of the registered policies with ``role``, in registration order."""
    return [p.name for p in POLICIES.values() if p.role == role]


def get_policy(name: str) -> Policy:
    """The registered policy ``name``; unknown names raise ``UnknownName``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownName("policy", name, list(POLICIES)) from None


def production_policy(name: str, *, benchmark: bool = False) -> Policy:
    """The registered policy ``name`` if a deployment may run it (an ablation only with ``benchmark``);
    ``ValueError`` for an ablation without it, ``UnknownName`` for an unknown name."""
    policy = get_policy(name)
    if not benchmark and policy.role not in PRODUCTION_ROLES:
        allowed = [p.name for p in POLICIES.values() if p.role in PRODUCTION_ROLES]
        raise ValueError(
            f"policy {name!r} is an ablation (a benchmark-only variant of ours); a deployment runs one of "
            f"{', '.join(allowed)}, or sets the benchmark switch to run an ablation"
        )
    return policy


for _p in (
    Policy(
        "hexgen",
        "wbi",
        "urgency",
        "HexGen-Flow (WB dispatch + urgency queues + interference-aware placement)",
        "ours",
        default_alpha=0.3,
        prefix_aware=True,
        prefix_credit=3.0,
        admission="predictive",
        split_predicted=True,
    ),
    Policy(
        "hexgen-paper", "wb", "urgency", "HexGen-Flow as published (no interference or prefix term)", "ablation", 0.3
    ),
    Policy("hexgen-noprefix", "wbi", "urgency", "hexgen blind to the prefix cache", "ablation", 0.3),
    Policy("wb-fcfs", "wb", "fcfs", "HexGen-Flow ablation: no priority queue", "ablation", default_alpha=0.3),
    Policy("rr-pq", "rr", "urgency", "HexGen-Flow ablation: no WB dispatcher", "ablation"),
    Policy("rr-fcfs", "rr", "fcfs", "vLLM behind a round-robin load balancer", "baseline"),
    Policy("p2c-fcfs", "p2c", "fcfs", "Ray Serve power-of-two-choices router", "baseline"),
    Policy("lw-fcfs", "lw", "fcfs", "AIBrix least-busy-time / llm-d load-aware (least outstanding work)", "baseline"),
    Policy("eft-fcfs", "eft", "fcfs", "earliest finish time (HEFT-style heterogeneous list scheduling)", "baseline"),
    Policy("llf", "lw", "llf", "least laxity first on the end-to-end deadline", "baseline"),
    Policy("edf", "lw", "edf", "earliest deadline first", "baseline"),
    Policy("vtc", "lw", "vtc", "virtual token counter fair share across tenants", "baseline"),
    Policy(
        "llmd",
        "llmd",
        "fcfs",
        "llm-d inference scheduler (prefix-cache 3 + queue 2 + KV-utilisation 2 scorers; P/D split over the "
        "cluster's prefill workers, pd-profile-handler threshold 0)",
        "baseline",
        prefix_aware=True,
        admission="saturation",
        split_threshold=0,
    ),
):
    register_policy(_p)

"""The sections of ``gateway.yaml`` that run the gateway as a service: worker discovery, leader election,
operator access, idempotency, and the background alpha tuner and profile refit (``gateway.config.gateway``
holds the file's model and its request-path sections)."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.base import FieldError, PosFloat, Share, _Strict
from gateway.config.cluster import KnownModel
from gateway.config.tenants import KeyHash


class TuningConfig(_Strict):
    """Background alpha re-tuning: the last ``window_workflows`` finished workflows, replayed in the simulator.

    Counted in workflows, not seconds, so a P95 can tell alphas apart at any rate (docs/live-gateway.md,
    "Alpha re-tuning"); ``max_age_s`` only leaves out stale workflows."""

    enabled: bool = Field(True, description="Re-tune alpha in the background (only for WB policies).")
    window_workflows: int = Field(
        300,
        ge=10,
        le=10_000,
        description="The last this many finished workflows are replayed (the window; also the most kept in memory).",
    )
    every_workflows: int = Field(
        50, ge=1, description="Re-tune once this many more workflows have finished since the last run."
    )
    interval_s: PosFloat = Field(
        60.0, description="How often the task checks whether a run is due (at most one run per interval)."
    )
    max_age_s: PosFloat = Field(
        7200.0, description="Staleness guard: workflows that arrived longer ago than this are left out of the window."
    )
    min_workflows: int = Field(20, ge=1, description="Tune only when the window holds at least this many.")
    hysteresis: float = Field(
        0.03,
        ge=0.0,
        lt=1.0,
        description="Switch alpha only if the chosen one's simulated P95 beats the current one's by this fraction.",
    )
    grid: list[Share] | None = Field(
        None, min_length=1, description="Alpha grid (default 0, 0.1, ..., 1); the simulation runs once per value."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        # The window used to be counted in seconds; say what replaced the old keys instead of "extra input".
        if isinstance(data, dict):
            for old in ("window_s", "max_window_workflows"):
                if old in data:
                    raise FieldError(
                        old,
                        f"{old} was removed: the window is counted in workflows now "
                        "(window_workflows; max_age_s is the staleness guard)",
                    )
        return data

    at_most = {"min_workflows": "window_workflows"}  # noqa: RUF012 (read only)


class RefitConfig(_Strict):
    """Slow online refit of each worker's profile constants from its completed calls (``gateway.profiling.refit``).

    The rule: docs/architecture.md (background tasks). Off by default: it corrects an uncalibrated or
    mislabelled profile, but under overload it also moves correct ones; leader only."""

    enabled: bool = Field(
        False, description="Refit the workers' profiles online (off by default: see the section's text)."
    )
    interval_s: PosFloat = Field(60.0, description="How often the task looks for workers due for a refit, seconds.")
    min_calls: int = Field(
        200, ge=20, le=100_000, description="Completed calls a worker needs in its window to be refitted."
    )
    window_calls: int = Field(
        1000, ge=20, le=100_000, description="The last this many completed calls per worker are kept and fitted."
    )
    max_step: float = Field(1.5, gt=1.0, le=10.0, description="Largest factor (up or down) a constant moves per refit.")
    max_drift: float = Field(
        8.0, gt=1.0, le=100.0, description="Largest factor a constant may reach from the configured profile's."
    )
    max_error: float = Field(
        0.3,
        gt=0.0,
        le=10.0,
        description="Largest median relative error of the best fit within max_drift; above it the model does not "
        "describe the worker and no refit is applied.",
    )
    min_gain: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="A fit is applied only if its error is below the current profile's by this fraction.",
    )

    at_most = {"min_calls": "window_calls"}  # noqa: RUF012 (read only)

    @model_validator(mode="after")
    def _drift(self) -> RefitConfig:
        if self.max_drift < self.max_step:
            raise FieldError("max_drift", f"{self.max_drift:g} is below max_step ({self.max_step:g})")
        return self


class _KubeApiSettings(_Strict):
    """How to reach the Kubernetes API server (shared by discovery and leader election)."""

    api_url: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        description="API server URL (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).",
    )
    token_file: str = Field(
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        description="Bearer token file (re-read on every request: projected tokens rotate). Missing: no auth.",
    )
    ca_file: str | None = Field(
        "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        description="CA bundle of the API server (missing file: the system's CAs).",
    )


class KubernetesDiscoveryConfig(_KubeApiSettings):
    """Workers taken from Kubernetes pods selected by label (list + watch of the pods API).

    How a pod becomes a worker (labels, annotations, ports, readiness): deploy/k8s/README.md, "Worker
    discovery"."""

    namespace: str | None = Field(
        None, description="Namespace of the worker pods (default: the gateway's own, from its service account)."
    )
    label_selector: str = Field(
        "hexflow.io/role=worker", min_length=1, description="Label selector of the worker pods."
    )
    period_s: PosFloat = Field(
        10.0,
        description="Discovery period: the pods are listed again at least this often (watch mode), or "
        "exactly this often (poll mode); changes take effect within it.",
    )
    watch: bool = Field(True, description="Follow changes with a watch between lists (else poll every period_s).")
    timeout_s: PosFloat = Field(10.0, description="Timeout of one list request (and of connecting).")
    gpu_label: str = Field("hexflow.io/gpu", min_length=1, description="Pod label holding the GPU type.")
    model_annotation: str = Field(
        "hexflow.io/model", min_length=1, description="Pod annotation (or label) holding the model profile."
    )
    served_model_annotation: str = Field(
        "hexflow.io/served-model",
        min_length=1,
        description="Pod annotation with the model name the worker serves (default: the model profile's name).",
    )
    capacity_annotation: str = Field(
        "hexflow.io/capacity", min_length=1, description="Pod annotation (or label) with the in-flight limit."
    )
    port_annotation: str = Field("hexflow.io/port", min_length=1, description="Pod annotation with the HTTP port.")
    profile_annotation: str = Field(
        "hexflow.io/profile",
        min_length=1,
        description="Pod annotation (or label) naming the performance profile: a label of the pod's model in the "
        "catalogue or in profiles_file (default: the catalogue's profile of the GPU label).",
    )
    default_model: KnownModel | None = Field(
        None, description="Model profile when a pod names none (default: cluster's)."
    )
    default_capacity: int | None = Field(
        None, ge=1, le=1024, description="In-flight limit when a pod names none; default: derived from its profile."
    )
    default_port: int = Field(8000, ge=1, le=65535, description="Port when a pod names none.")


class DiscoveryConfig(_Strict):
    """Where workers are discovered at run time (in addition to ``cluster.workers``)."""

    kubernetes: KubernetesDiscoveryConfig | None = Field(None, description="Discover workers from Kubernetes pods.")
    remove_grace_s: PosFloat = Field(
        120.0,
        description="A removed worker's calls still running after this are re-dispatched to other workers.",
    )


class AdminConfig(_Strict):
    """Operator access: the live status page (``/ui``) and, optionally, ``/v1/status`` and ``/metrics``.

    An admin key is not a tenant key (it runs no workflows, and a tenant key opens no admin route);
    without one the status page is off and status and metrics stay open."""

    api_key_sha256: list[KeyHash] = Field(
        default_factory=list,
        description="SHA-256 digests of the operators' keys (`hexflow tenants hash-key KEY`); empty: /ui is off.",
    )
    protect_status: bool = Field(False, description="GET /v1/status needs an admin key (default: open).")
    protect_metrics: bool = Field(
        False, description="GET /metrics needs an admin key (Prometheus: bearer_token in its scrape config)."
    )
    window_s: float = Field(
        300.0,
        ge=30.0,
        le=3600.0,
        allow_inf_nan=False,
        description="The status page's rolling window: per-tenant attainment and goodput over this many seconds.",
    )
    recent_workflows: int = Field(
        200, ge=1, le=10_000, description="Finished workflows kept for the status page's slowest-workflows list."
    )

    @model_validator(mode="after")
    def _keys_for_protection(self) -> AdminConfig:
        for name in ("protect_status", "protect_metrics"):
            if getattr(self, name) and not self.api_key_sha256:
                raise FieldError(name, "needs admin.api_key_sha256: with no admin key nobody could read it")
        return self


LEASE_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A Kubernetes object name (a DNS subdomain: lower-case letters, digits, ``-`` and ``.``, at most 253)."""


class LeaderElectionConfig(_KubeApiSettings):
    """High availability: several gateway replicas, one leader holding a ``coordination.k8s.io/v1`` Lease.

    docs/live-gateway.md, "High availability". Off by default: one replica needs none of it."""

    enabled: bool = Field(False, description="Elect a leader among the gateway replicas (Kubernetes Lease).")
    lease_name: str = Field(
        "hexflow-gateway", pattern=LEASE_NAME, description="Name of the Lease object (one per gateway Deployment)."
    )
    namespace: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="Namespace of the Lease (default: the gateway's own, from its service account).",
    )
    identity: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="This replica's name in the Lease's holderIdentity (default: $POD_NAME, else the host name).",
    )
    lease_duration_s: int = Field(
        15, ge=1, le=3600, description="How long a Lease that is not renewed keeps other replicas out (seconds)."
    )
    renew_deadline_s: PosFloat = Field(
        10.0, description="A leader that has not renewed its Lease for this long steps down (< lease_duration_s)."
    )
    retry_period_s: PosFloat = Field(
        2.0, description="How often the leader renews, and how often the others try to acquire (< renew_deadline_s)."
    )

    @model_validator(mode="after")
    def _periods(self) -> LeaderElectionConfig:
        # client-go's rules: the leader must give up before others may take over, and retry within its deadline.
        if self.renew_deadline_s >= self.lease_duration_s:
            raise FieldError(
                "renew_deadline_s",
                f"must be less than lease_duration_s ({self.lease_duration_s}), got {self.renew_deadline_s:g}: "
                "a leader that cannot renew must step down before another replica may take the lease",
            )
        if self.retry_period_s * 1.2 > self.renew_deadline_s:
            raise FieldError(
                "retry_period_s",
                f"must be at most renew_deadline_s / 1.2 ({self.renew_deadline_s / 1.2:.3g}, "
                f"the jitter's margin), got {self.retry_period_s:g}",
            )
        return self


class IdempotencyConfig(_Strict):
    """``Idempotency-Key`` on ``POST /v1/workflows`` and ``/v1/text2sql``: a retry gets the first answer.

    Per tenant and per replica (in memory): docs/live-gateway.md, "Retries and idempotency keys"."""

    enabled: bool = Field(True, description="Honour the Idempotency-Key header (else it is ignored).")
    ttl_s: PosFloat = Field(600.0, description="How long a finished request's answer is kept for retries.")
    max_keys: int = Field(10_000, ge=1, le=10_000_000, description="Most keys remembered (finished and running).")
    max_bytes: int = Field(
        64 << 20, ge=1 << 16, description="Most bytes of stored answers; a larger answer is not stored."
    )

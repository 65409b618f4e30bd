"""``config/gateway.yaml``: everything the live gateway needs, validated once at start
(``hexflow serve --config config/gateway.yaml``). Relative paths resolve against the file's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.base import FieldError, Fraction, PosFloat, Share, _Strict, load_yaml_model
from gateway.config.cluster import ClusterConfig, build_workers
from gateway.config.gpus import GpuCatalog, load_gpu_catalog, load_profiles_file
from gateway.config.operations import (
    AdminConfig,
    DiscoveryConfig,
    IdempotencyConfig,
    LeaderElectionConfig,
    RefitConfig,
    TuningConfig,
)
from gateway.core.degrade import BURST_CAPACITY
from gateway.core.policy import POLICIES, production_policy
from gateway.core.predict import SUSTAINABLE_SHARE
from gateway.core.scheduler import BEST_EFFORT_SHARE
from gateway.core.worker import WorkerInfo
from gateway.errors import ConfigError, unknown_name_message


class ListenConfig(_Strict):
    """Where the gateway's HTTP server listens."""

    host: str = Field("127.0.0.1", description="Bind address (0.0.0.0 in containers).")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0: any free port).")


class LimitsConfig(_Strict):
    """Bounds on what one request and the whole gateway may hold (memory is bounded by these)."""

    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body accepted (413 above).")
    max_calls_per_workflow: int = Field(512, ge=1, le=100_000, description="Calls in one /v1/workflows DAG.")
    max_queued_calls: int = Field(
        20_000, ge=1, description="Calls waiting in all gateway queues; new workflows get 429 while it is reached."
    )
    max_active_workflows: int = Field(10_000, ge=1, description="Workflows in progress at once (429 above).")
    max_tokens: int = Field(32_768, ge=1, description="Largest input or output token count of one call.")
    max_prompt_chars: int = Field(1 << 20, ge=1, description="Largest text of one call's messages.")
    parked_timeout_s: PosFloat = Field(
        60.0, description="How long a call waits for any healthy worker before its workflow fails (503)."
    )


class AdmissionConfig(_Strict):
    """Predictive admission (tenants with ``predictive_admission``): when a new workflow is predicted to make it."""

    sustainable_share: Fraction = Field(
        SUSTAINABLE_SHARE,
        description="The share of the engines' full-batch throughput that the work ahead of a new workflow (queued, "
        "in flight and committed by admitted workflows) is forecast at. Lower keeps more promises under overload "
        "and refuses more near capacity (what each share keeps and refuses: hexflow bench admission, "
        "docs/benchmarks.md 'Admission').",
    )
    headroom: Fraction = Field(
        0.9,
        description="A workflow is admitted when its predicted completion is within this share of its deadline "
        "(the margin absorbs what the estimates do not see yet).",
    )
    best_effort_share: Fraction = Field(
        BEST_EFFORT_SHARE,
        description="A worker starts a best-effort call (tenants with on_predicted_miss: best_effort) only while "
        "fewer than this share of its slots, at least one, are in flight. vLLM does not preempt a running call "
        "for a more urgent one: best-effort calls started on busy workers slowed the urgent ones until most "
        "arrivals were predicted to miss (docs/benchmarks.md 'Admission').",
    )
    burst_capacity: float | None = Field(
        BURST_CAPACITY,
        gt=0.0,
        le=100.0,
        description="Degradation ahead of the backlog: a burst starts when the full-quality work arriving per second "
        "(over the last half deadline) exceeds this many cluster seconds per second of the latency model (every "
        "worker at full batch is 1) while the backlog ahead of arrivals is forming; in a burst, adaptive tenants' "
        "questions are capped at the most accurate setting whose work fits, before the queues build "
        "(docs/text2sql.md, 'Bursts: degrading ahead of the backlog'; what it buys: hexflow bench burst). null: off.",
    )
    best_effort_max_age: float | None = Field(
        4.0,
        ge=1.0,
        description="A best-effort workflow still unfinished this many times its deadline after it arrived is "
        "shed (its calls cancelled, its client answered 503, counted shed): under sustained overload best-effort "
        "work waits for idle slots that may not come, and it counts against limits.max_queued_calls and "
        "max_active_workflows meanwhile. null: never (it waits as long as its client does).",
    )


class TimeoutsConfig(_Strict):
    """Timeouts of a call to a worker, phase by phase, and the HTTP clients' settings (their connection pools).

    The phases (connect, a stream's headers, every gap, the whole call scaled by its profile prediction,
    never by recent slowness) and what a timeout does: docs/architecture.md ("Failure handling")."""

    connect_s: PosFloat = Field(
        2.0, description="TCP connect timeout; a worker that cannot be reached in it is marked down."
    )
    headers_s: PosFloat = Field(30.0, description="Streaming calls: longest wait for the worker's response headers.")
    stream_idle_s: PosFloat = Field(
        60.0, description="Longest gap between two chunks of an answer after its headers (a stream's first included)."
    )
    call_s: PosFloat = Field(900.0, description="Longest an LLM call may take on a worker, whatever its size.")
    call_floor_s: PosFloat = Field(
        30.0, description="Whole-call bound: this plus call_factor x the call's predicted latency (capped at call_s)."
    )
    call_factor: float = Field(
        10.0,
        ge=1.0,
        allow_inf_nan=False,
        description="Whole-call bound: how many times its predicted latency a call may take (plus call_floor_s).",
    )
    max_response_bytes: int = Field(
        32 << 20, ge=1024, description="Largest answer body read from a worker (a larger one is a worker error)."
    )
    keepalive_expiry_s: PosFloat = Field(
        4.0, description="Idle keep-alive connections are closed after this (below uvicorn/vLLM's 5 s)."
    )
    max_connections: int = Field(2048, ge=1, description="Connection pool size across all workers.")

    def call_timeout(self, predicted_s: float) -> float:
        """The whole-call bound of a call predicted to take ``predicted_s`` seconds on its worker."""
        return min(self.call_s, self.call_floor_s + self.call_factor * max(predicted_s, 0.0))


class ScrapeConfig(_Strict):
    """Scraping every worker's ``/metrics`` (vLLM's ``vllm:*`` series)."""

    period_s: PosFloat = Field(1.0, description="Scrape period.")
    timeout_s: PosFloat = Field(2.0, description="Timeout of one scrape.")


class OutlierConfig(_Strict):
    """Outlier ejection: a worker whose recent calls fail or run slow far more than its peers' is ejected.

    The verdict, the back-off and the probe call: docs/architecture.md ("Failure handling")."""

    enabled: bool = Field(True, description="Eject outliers (else only consecutive failures mark a worker down).")
    window: int = Field(20, ge=2, le=1000, description="Recent calls per worker that are judged.")
    min_calls: int = Field(5, ge=1, le=1000, description="Calls in a worker's window before it is judged.")
    error_rate: Fraction = Field(0.3, description="Eject a worker when at least this share of its window failed...")
    error_rate_margin: Share = Field(0.2, description="...and that share is at least this much above its peers'.")
    latency_ratio: float = Field(
        3.0,
        gt=1.0,
        allow_inf_nan=False,
        description="Eject when its calls' typical observed/predicted latency is this many times its peers'.",
    )
    base_ejection_s: PosFloat = Field(30.0, description="First ejection's length; it doubles on repeated ejections.")
    max_ejection_s: PosFloat = Field(300.0, description="Longest ejection; also how long a re-admission is remembered.")
    max_ejected_fraction: Fraction = Field(0.5, description="Largest share of the workers ejected at once.")
    probe_timeout_s: PosFloat = Field(10.0, description="Timeout of the probe call that re-admits a worker.")
    at_most = {"min_calls": "window", "base_ejection_s": "max_ejection_s"}  # noqa: RUF012 (read only)


class HealthConfig(_Strict):
    """Worker health: probes of ``/health``, failures of real calls, and outlier ejection."""

    period_s: PosFloat = Field(
        2.0, description="Probe period of each worker's /health (and of ejected workers' probe calls)."
    )
    timeout_s: PosFloat = Field(2.0, description="Timeout of one probe.")
    failures_to_down: int = Field(
        2, ge=1, description="Consecutive failed probes or calls after which a worker is marked down."
    )
    outlier: OutlierConfig = Field(default_factory=OutlierConfig)


class RetryConfig(_Strict):
    """What happens to a call when its worker fails it (connection error, 5xx, timeout, malformed answer).

    Sent again to a worker that has not failed it, up to ``max_attempts``, then its workflow fails (502);
    a stream that already sent bytes is never retried."""

    max_attempts: int = Field(3, ge=1, le=20, description="Attempts per call, on any workers, before it fails.")


class Text2SqlConfig(_Strict):
    """``POST /v1/text2sql``: the pipeline's shape and the limits on a question."""

    candidates: int = Field(2, ge=1, le=8, description="SQL candidates generated in parallel.")
    max_revisions: int = Field(10, ge=0, le=50, description="Most revise rounds per candidate.")
    evaluate: bool = Field(
        True,
        description="Generate unit tests and evaluate the candidates (never with a single candidate). These "
        "are the full-quality knobs; a tenant with `quality: adaptive` or `fast` may get less (tenants.yaml).",
    )
    unit_tests: int = Field(3, ge=0, le=20, description="Unit tests asked of the unit-test stage.")
    max_question_chars: int = Field(2000, ge=1, description="Longest question accepted (422 above).")
    max_evidence_chars: int = Field(4000, ge=0, description="Longest evidence (hint) accepted (422 above).")
    schema_max_chars: int = Field(24_000, ge=1000, description="Serialised schema longer than this is cut.")


class GatewayConfig(_Strict):
    """The whole gateway configuration file."""

    cluster: ClusterConfig | None = Field(
        None, description="Static workers (each with a url), as in config/clusters/*.yaml; optional with discovery."
    )
    discovery: DiscoveryConfig | None = Field(None, description="Workers discovered at run time (Kubernetes).")
    policy: str = Field(
        "hexgen",
        description="Scheduling policy (hexgen, rr-fcfs, lw-fcfs, ...): a policy of role ours or baseline; an "
        "ablation policy only with benchmark: true.",
    )
    alpha: Share | None = Field(None, description="Starting alpha (default: the policy's).")
    seed: int = Field(0, description="Seed of the scheduler's RNG (p2c) and of the tuner.")
    prefix_caching: bool = Field(
        True,
        description="The workers cache prompt prefixes (vLLM's automatic prefix caching, on by default). "
        "Prefix-aware policies (hexgen, llmd) then keep an index of the prompt blocks sent to each worker and "
        "prefer the worker that holds a call's prefix; the alpha tuner's replays cache too. false: workers "
        "run with --no-enable-prefix-caching.",
    )
    tenants_file: str = Field("tenants.yaml", description="Tenants file, relative to this file's folder.")
    tenants_reload_s: PosFloat = Field(2.0, description="How often the tenants file is checked for changes.")
    databases_file: str | None = Field(
        None, description="Databases for /v1/text2sql (db_id -> url), relative to this file's folder; none: disabled."
    )
    text2sql: Text2SqlConfig = Field(default_factory=Text2SqlConfig)
    gpu_catalog: str | None = Field(None, description="GPU catalogue file (default: the packaged gpus.yaml).")
    profiles_file: str | None = Field(
        None,
        description="Profiles overlay merged over the catalogue's (a 'profiles:' section as 'hexflow calibrate "
        "--out' writes it; relative to this file): workers name its labels with 'profile', pods with the "
        "discovery profile annotation.",
    )
    listen: ListenConfig = Field(default_factory=ListenConfig)
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines on stderr: text, or json (one object per line with ts, level, logger, message, "
        "and request_id and workflow_id where known). $HEXFLOW_LOG_FORMAT and hexflow serve --log-format "
        "override it.",
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    tuning: TuningConfig = Field(default_factory=TuningConfig)
    refit: RefitConfig = Field(default_factory=RefitConfig)
    time_scale: PosFloat = Field(
        1.0,
        description="Emulated workers only: they run at --time-scale S, so every GPU profile's latency is "
        "multiplied by S. 1 for real GPUs.",
    )
    shutdown_grace_s: PosFloat = Field(30.0, description="On SIGTERM, how long in-flight workflows may finish.")
    admin: AdminConfig = Field(default_factory=AdminConfig)
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    idempotency: IdempotencyConfig = Field(default_factory=IdempotencyConfig)
    benchmark: bool = Field(
        False,
        description="Benchmark mode, off in production: /v1/workflows accepts the benchmark-only call fields "
        "(prompt_tokens, shared_prefix, ignore_eos: synthetic prompts of exact sizes, as the live benchmarks "
        "replay traces) and policy may name an ablation policy. Off: those fields are refused with 422 and an "
        "ablation policy is a configuration error. The live benchmarks turn it on in the gateways they start.",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(unknown_name_message("policy", v, POLICIES))
        return v

    @model_validator(mode="after")
    def _production_policy(self) -> GatewayConfig:
        try:
            production_policy(self.policy, benchmark=self.benchmark)
        except ValueError as e:
            raise FieldError("policy", f"{e} (benchmark: true in gateway.yaml)") from None
        return self

    @model_validator(mode="after")
    def _urls(self) -> GatewayConfig:
        if self.cluster is None and (self.discovery is None or self.discovery.kubernetes is None):
            raise FieldError("cluster", "no workers: give cluster.workers, discovery.kubernetes, or both")
        for i, w in enumerate(self.cluster.workers if self.cluster is not None else []):
            if w.url is None:
                raise FieldError(f"cluster.workers.{i}.url", "every live worker needs a url (http://host:port)")
            if w.role != "colocated":
                raise FieldError(
                    f"cluster.workers.{i}.role",
                    "prefill/decode roles run in the simulator (hexflow bench); the live gateway runs every worker "
                    "colocated for now: remove the role",
                )
        return self


def _resolve(base: Path, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else base / p


class LoadedConfig:
    """A validated gateway config with its resolved paths, catalogue and scheduler workers."""

    def __init__(self, cfg: GatewayConfig, path: Path, catalog: GpuCatalog) -> None:
        self.cfg = cfg
        self.path = path
        self.base_dir = path.parent
        self.catalog = catalog
        self.resolved = cfg.cluster.expanded() if cfg.cluster is not None else []
        self.workers: list[WorkerInfo] = (
            build_workers(cfg.cluster, catalog, time_scale=cfg.time_scale) if cfg.cluster is not None else []
        )

    @property
    def default_model(self) -> str:
        """Model profile of a discovered pod that names none."""
        kube = self.cfg.discovery.kubernetes if self.cfg.discovery is not None else None
        if kube is not None and kube.default_model is not None:
            return kube.default_model
        if self.cfg.cluster is not None:
            return self.cfg.cluster.model
        return str(ClusterConfig.model_fields["model"].default)

    @property
    def databases_path(self) -> Path | None:
        """The databases file, resolved against the config file's folder (None: text2sql disabled)."""
        return None if self.cfg.databases_file is None else _resolve(self.base_dir, self.cfg.databases_file)

    @property
    def tenants_path(self) -> Path:
        """The tenants file, resolved against the config file's folder."""
        return _resolve(self.base_dir, self.cfg.tenants_file)

    def existing_tenants_path(self) -> Path:
        """``tenants_path``, checked to be a file: ``ConfigError`` naming the config file, ``tenants_file`` and
        the path it resolved to otherwise (what the gateway serves with; other readers of the config need
        no tenants)."""
        path = self.tenants_path
        if not path.is_file():
            problem = "not a file" if path.exists() else "file not found"
            how = "" if Path(self.cfg.tenants_file).is_absolute() else " (resolved against the config file's folder)"
            raise ConfigError(
                str(self.path), "tenants_file", f"{problem}: {self.cfg.tenants_file!r} is {path.absolute()}{how}"
            )
        return path


def load_gateway_config(path: Path | str, *, time_scale: float | None = None, benchmark: bool = False) -> LoadedConfig:
    """Load and validate ``gateway.yaml`` (raises ``ConfigError`` naming file and field).

    ``time_scale`` overrides the file's (``hexflow serve --time-scale``, for emulated clusters); ``benchmark``
    turns benchmark mode on whatever the file says (``hexflow serve --benchmark``).
    """
    overrides = {"benchmark": True} if benchmark else None
    path = Path(path)
    # First pass without the catalogue to learn which catalogue to use, then validate names against it.
    raw = load_yaml_model(path, GatewayConfig, overrides=overrides)
    catalog = load_gpu_catalog(None if raw.gpu_catalog is None else _resolve(path.parent, raw.gpu_catalog))
    if raw.profiles_file is not None:
        overlay = load_profiles_file(_resolve(path.parent, raw.profiles_file))
        try:
            catalog = catalog.with_profiles(overlay)
        except FieldError as exc:
            raise ConfigError(raw.profiles_file, exc.field, str(exc)) from None
    cfg = load_yaml_model(path, GatewayConfig, context={"catalog": catalog}, overrides=overrides)
    if time_scale is not None:
        if not time_scale > 0:
            raise ConfigError(str(path), "time_scale", f"must be positive, got {time_scale}")
        cfg = cfg.model_copy(update={"time_scale": time_scale})
    return LoadedConfig(cfg, path, catalog)

"""``config/tenants.yaml``: the tenants, their hashed API keys (``hexflow tenants hash-key KEY``), deadline
ranges, weights and limits; the runtime store is ``gateway.live.tenants.TenantStore``."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from gateway.config.base import CONFIG_DIR, FieldError, PosFloat, _Strict
from gateway.core.degrade import QualityMode

DEFAULT_TENANTS = CONFIG_DIR / "tenants.yaml"
"""The tenants file of the checkout (or of ``$HEXFLOW_CONFIG_DIR``)."""

_HEX = frozenset("0123456789abcdef")
_SHA256_HEX_LEN = 64


def hash_key(key: str) -> str:
    """The SHA-256 digest of an API key (UTF-8), as 64 lowercase hex characters: what the file stores."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _check_key_hash(value: Any) -> str:
    """Accept a SHA-256 hex digest; the error never repeats the value (it may be a plaintext key)."""
    if not isinstance(value, str):
        raise ValueError(f"expected a SHA-256 digest (64 lowercase hex characters), got a {type(value).__name__}")
    if len(value) == _SHA256_HEX_LEN and set(value) <= _HEX:
        return value
    if len(value) == _SHA256_HEX_LEN and set(value.lower()) <= _HEX:
        raise ValueError("write the SHA-256 digest in lowercase hex")
    raise ValueError(
        "expected a SHA-256 digest (64 lowercase hex characters); this looks like a plaintext key: "
        "store the output of `hexflow tenants hash-key KEY` instead, never the key itself"
    )


KeyHash = Annotated[str, BeforeValidator(_check_key_hash)]
TenantName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class TenantConfig(_Strict):
    """One entry of ``tenants``: a caller of the gateway, its keys, deadlines and share."""

    name: TenantName = Field(description="Tenant name, also a Prometheus label value: [A-Za-z0-9_.-]{1,64}.")
    api_key_sha256: list[KeyHash] = Field(
        min_length=1, description="SHA-256 digests of the tenant's API keys (`hexflow tenants hash-key KEY`)."
    )
    default_deadline_s: PosFloat = Field(description="Deadline of a workflow that asks for none, seconds.")
    min_deadline_s: PosFloat = Field(1.0, description="Shortest deadline the tenant may ask for, seconds.")
    max_deadline_s: PosFloat = Field(description="Longest deadline the tenant may ask for, seconds.")
    priority_weight: PosFloat = Field(
        1.0,
        description="The tenant's share weight under the vtc policy (weighted virtual token counters: while "
        "tenants are backlogged, weight 2 gets twice the tokens of weight 1). Other policies ignore it; under "
        "hexgen the deadline alone sets the urgency.",
    )
    max_concurrent_workflows: int = Field(64, ge=1, description="Workflows of the tenant in flight at once.")
    predictive_admission: bool = Field(
        True,
        description="Admit a workflow only if its predicted completion (the queue ahead of it on the workers "
        "it would use, plus its critical path) meets its deadline, and watch admitted workflows whose queued "
        "calls can no longer make it (see on_predicted_miss). false: only the concurrency limits apply.",
    )
    on_predicted_miss: Literal["reject", "best_effort"] = Field(
        "reject",
        description="What happens to a workflow predicted to miss its deadline (with predictive_admission). "
        "reject: refused at admission with 429 and a Retry-After computed from the queue, and, once admitted, "
        "shed as soon as its queued calls can no longer make it (503 with Retry-After; counted 'shed'). "
        "best_effort: admitted (or kept) at the lowest urgency: its calls wait behind every other call.",
    )
    quality: QualityMode = Field(
        "full",
        description="Answer quality of /v1/text2sql under load. full: always the configured pipeline "
        "(text2sql.candidates, max_revisions, unit tests and evaluation). adaptive: at arrival and at each stage "
        "boundary, the most accurate knob setting (gateway/config/quality.yaml) whose remaining stages the "
        "scheduler predicts to finish within the deadline, else the floor (one candidate, one revision round, "
        "no unit tests or evaluation); the response's `degraded` says what was skipped and why. fast: always "
        "the floor.",
    )
    databases: list[Annotated[str, Field(pattern=r"^(\*|[A-Za-z0-9_.-]{1,64})$")]] = Field(
        default_factory=lambda: ["*"],
        description="Database ids the tenant may query with /v1/text2sql ('*': all configured ones).",
    )

    @model_validator(mode="after")
    def _deadlines_ordered(self) -> TenantConfig:
        lo, default, hi = self.min_deadline_s, self.default_deadline_s, self.max_deadline_s
        if not lo <= default <= hi:
            raise ValueError(
                f"tenant {self.name!r}: min_deadline_s <= default_deadline_s <= max_deadline_s must hold, "
                f"got {lo:g} <= {default:g} <= {hi:g}"
            )
        return self


class TenantsFile(_Strict):
    """``config/tenants.yaml``: the tenants, with unique names and no key hash shared by two of them."""

    tenants: list[TenantConfig] = Field(min_length=1, description="The tenants.")

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        names: dict[str, int] = {}
        owners: dict[str, str] = {}
        for i, t in enumerate(self.tenants):
            if t.name in names:
                raise FieldError(
                    f"tenants.{i}.name", f"duplicate tenant name {t.name!r} (also tenants.{names[t.name]})"
                )
            names[t.name] = i
            for k, h in enumerate(t.api_key_sha256):
                other = owners.get(h)
                if other is not None and other != t.name:
                    raise FieldError(
                        f"tenants.{i}.api_key_sha256.{k}",
                        f"key hash {h[:12]}... belongs to two tenants, {other!r} and {t.name!r}",
                    )
                owners[h] = t.name
        return self

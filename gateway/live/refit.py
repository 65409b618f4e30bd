"""The live side of the online profile refit: a background task around ``gateway.profiling.refit.Refitter``
(fits in a thread, applied on the loop unless the worker changed; ``hexflow_profile_refits_total``)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from gateway.core.worker import WorkerInfo
from gateway.live.monitor import stopped_within
from gateway.profiling.refit import FitOutcome, RefitSettings, Refitter, fit_job, profile_status

if TYPE_CHECKING:
    from gateway.config.operations import RefitConfig
    from gateway.live.service import Gateway

log = logging.getLogger("hexflow.refit")

FIT_TIMEOUT_S = 30.0
"""Longest wait for one worker's fit (the thread is left to finish; its outcome is then dropped)."""


class ProfileRefitTask:
    """Owns the ``Refitter`` of a gateway; ``run`` is the background loop, ``refit_once`` one pass."""

    def __init__(self, gateway: Gateway, cfg: RefitConfig) -> None:
        self.gw = gateway
        # The refit's settings: gateway.yaml's ``refit`` fields of the same names.
        self.refitter = Refitter(RefitSettings(**{f.name: getattr(cfg, f.name) for f in fields(RefitSettings)}))
        self.refitter.attach(gateway.scheduler)

    async def run(self, stop: asyncio.Event) -> None:
        """Every ``interval_s`` until ``stop`` is set: refit the workers that are due."""
        while not await stopped_within(stop, self.refitter.s.interval_s):
            await self.refit_once()

    async def refit_once(self) -> list[str]:
        """Attempt every due worker now; returns the result label of each attempt."""
        gw = self.gw
        results: list[str] = []
        for job in self.refitter.jobs(gw.scheduler):
            try:
                out = await asyncio.wait_for(asyncio.to_thread(fit_job, job, self.refitter.s), FIT_TIMEOUT_S)
            except Exception as exc:  # a solver crash or the timeout: count it, keep the profile
                out = FitOutcome(job, "failed", None, None, None, f"{type(exc).__name__}")
            old = job.info.profile
            result = self.refitter.apply(gw.scheduler, out, gw.clock())
            name = job.info.name
            gw.metrics.for_worker(gw.metrics.profile_refits, name, result).inc()
            if result == "applied" and out.profile is not None:
                new = out.profile
                log.info(
                    "profile of %s refitted from %d calls (%s): iter_base_s %.4g -> %.4g, token_s %.4g -> %.4g, "
                    "ctx_s %.4g -> %.4g, request_overhead_s %.4g -> %.4g",
                    name, len(job.samples), out.reason,
                    old.iter_base_s, new.iter_base_s, old.token_s, new.token_s,
                    old.ctx_s, new.ctx_s, old.request_overhead_s, new.request_overhead_s,
                )  # fmt: skip
            else:
                log.debug("profile of %s kept: %s (%s)", name, result, out.reason)
            results.append(result)
        return results

    def status(self, info: WorkerInfo, now: float) -> dict[str, Any]:
        """The worker's profile and its refit state, for ``/v1/status``."""
        return {**profile_status(info), "refit": self.refitter.status(info, now)}

"""The simulator's engine model driven in real time (a test double for a GPU).

``RealTimeEngine`` owns a ``gateway.sim.engine.SimEngine`` (iteration-level continuous batching with
chunked prefill and KV limits, from the same GPU profile as the simulator) and runs it against the
wall clock: virtual seconds are real seconds divided by ``time_scale`` (0.05 makes a 20 s call take
1 s). Like SimPy's real-time environment it changes only how the clock advances, not the model.

One driver task sleeps until the engine's next planned segment end or until a request arrives, then
advances the model. Each request gets a ``Ticket`` whose ``changed`` event fires when its state moved
(a prefill finished, output tokens were produced, it finished); streaming responses wait on it.

With ``prefix_caching`` (vLLM's default) a request's prompt prefix chain (``gateway.core.prefix``: the
emulator names each full block of the prompt by a hash of its tokens) goes into the engine's prefix cache,
and a later request whose leading blocks match skips their prefill, as vLLM's automatic prefix caching.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.core.prefix import PrefixSeg
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.sim.engine import SimEngine

_DUMMY_WORKFLOW = StagedWorkflow(0, "emulator", 0.0, float("inf"), [Stage("x", (CallSpec("x", 1, 1),))])


@dataclass(eq=False)
class Ticket:
    """One request inside the engine."""

    call: Call
    arrived_real: float
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False
    engine_done_real: float | None = None
    first_token_real: float | None = None
    admitted_real: float | None = None
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache (known once admitted; vLLM's ``num_cached_tokens``)."""


class RealTimeEngine:
    """A ``SimEngine`` advanced by the wall clock, with a streaming tick while requests stream.

    Args:
        profile: the GPU/model performance profile (``config/gpus.yaml``).
        time_scale: real seconds per virtual second.
        priority_scheduling: order the engine's waiting queue by the request ``priority`` (vLLM's
            ``--scheduling-policy priority``).
        prefix_caching: cache the prompt prefixes requests name (vLLM's ``--enable-prefix-caching``).
        tick_s: real-time interval at which streaming requests are woken to emit new tokens. Streams
            are woken in ``tick_groups`` staggered groups (one group per tick, each stream every
            ``tick_s * tick_groups``), so hundreds of streams never all wake in one burst.
        clock: the real clock (injected for tests).
    """

    def __init__(
        self,
        profile: PerfProfile,
        *,
        time_scale: float = 1.0,
        priority_scheduling: bool = False,
        prefix_caching: bool = False,
        tick_s: float = 0.01,
        tick_groups: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0:
            raise ValueError("time_scale must be positive")
        self.profile = profile
        self.time_scale = time_scale
        self.tick_s = tick_s
        self.tick_groups = max(1, tick_groups)
        self._tick_no = 0
        self._clock = clock
        self._t0 = clock()
        self.prefix_caching = prefix_caching
        self.engine = SimEngine(profile, priority_scheduling=priority_scheduling, prefix_caching=prefix_caching)
        self._tickets: dict[int, Ticket] = {}
        self._unstarted: set[Ticket] = set()
        self._wakeup = asyncio.Event()
        self._next_id = 0
        self.streaming = 0
        self.iterations_advanced = 0
        self.advance_cpu_s = 0.0
        self.advances = 0

    # -- clocks -------------------------------------------------------------------------------
    def now(self) -> float:
        """The real clock's reading now."""
        return self._clock()

    def vnow(self) -> float:
        """Virtual (model) time now."""
        return (self._clock() - self._t0) / self.time_scale

    def to_real(self, v: float) -> float:
        """Real clock reading at virtual time ``v``."""
        return self._t0 + v * self.time_scale

    # -- requests -----------------------------------------------------------------------------
    def submit(
        self, input_tokens: int, output_tokens: int, priority: int = 0, prefix: tuple[PrefixSeg, ...] = ()
    ) -> Ticket:
        """Queue a request in the engine; the driver admits it at the next iteration boundary.

        ``prefix``: the prompt's prefix chain (ignored without prefix caching). Every request shares the
        engine's one dummy workflow, so only shared (not per-query) segments make sense here: name them by
        their content and equal prompts match.
        """
        self._next_id += 1
        spec = CallSpec("request", input_tokens, output_tokens, prefix)
        call = Call(self._next_id, _DUMMY_WORKFLOW, spec, 0.0)
        t = Ticket(call, self._clock())
        self._tickets[call.id] = t
        self._unstarted.add(t)
        self.engine.add(call, priority)
        self._advance(self.vnow(), kick=True)
        self._wakeup.set()
        return t

    def cancel(self, ticket: Ticket) -> None:
        """Forget a request whose client went away (a running one still finishes in the model)."""
        if not ticket.done and self.engine.remove(ticket.call):
            self._tickets.pop(ticket.call.id, None)
            self._unstarted.discard(ticket)
            ticket.done = True
            ticket.changed.set()

    def progress(self, ticket: Ticket) -> int:
        """Output tokens produced so far."""
        if ticket.done:
            return ticket.call.spec.output_tokens
        n, _ = self.engine.progress(ticket.call, self.vnow())
        return n

    @property
    def running(self) -> int:
        """Requests in the batch."""
        return self.engine.running

    @property
    def waiting(self) -> int:
        """Requests in the engine's waiting queue."""
        return len(self.engine.waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache reserved (vLLM's ``kv_cache_usage_perc`` is a 0..1 fraction)."""
        return self.engine.kv_used / max(self.profile.kv_capacity_tokens, 1)

    # -- the driver ---------------------------------------------------------------------------
    def _advance(self, now_v: float, *, kick: bool = False) -> None:
        """Apply every segment that ended by ``now_v``, then let waiting requests in."""
        t_cpu = time.process_time()
        eng = self.engine
        st = eng.stats
        while eng.busy and eng.wake_at <= now_v:
            at = eng.wake_at
            before = st.iterations
            for call in eng.on_wake(at):
                self._finish(call, at)
            self.iterations_advanced += st.iterations - before
            queried = st.prompt_tokens
            eng.kick(at)
            if st.prompt_tokens != queried:
                # Requests were admitted: note them now, while the engine still has their state (one
                # that finishes within this advance would otherwise never show its admission).
                self._mark_started()
        if kick or not eng.busy:
            eng.kick(now_v)
        self._mark_started()
        self.advance_cpu_s += time.process_time() - t_cpu
        self.advances += 1

    def _mark_started(self) -> None:
        if not self._unstarted:
            return
        for t in list(self._unstarted):
            admitted, first = self.engine.call_state(t.call)
            if admitted is not None and t.admitted_real is None:
                t.admitted_real = self.to_real(admitted)
                t.cached_tokens = self.engine.cached_of(t.call)
            if first is not None:
                t.first_token_real = self.to_real(first)
                self._unstarted.discard(t)
                t.changed.set()

    def _finish(self, call: Call, at_v: float) -> None:
        t = self._tickets.pop(call.id, None)
        if t is None:
            return
        t.done = True
        t.engine_done_real = self.to_real(at_v)
        self._unstarted.discard(t)
        if t.admitted_real is None:
            t.admitted_real = t.engine_done_real
        if t.first_token_real is None:
            t.first_token_real = t.engine_done_real
        t.changed.set()

    async def run(self) -> None:
        """Drive the model until cancelled."""
        while True:
            eng = self.engine
            timeout: float | None = None
            if eng.busy:
                timeout = max((eng.wake_at - self.vnow()) * self.time_scale, 0.0)
            if self.streaming and self._tickets:
                timeout = self.tick_s if timeout is None else min(timeout, self.tick_s)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            self._advance(self.vnow())
            if self.streaming:
                self._tick_no += 1
                group = self._tick_no % self.tick_groups
                for t in self._tickets.values():
                    if t.call.id % self.tick_groups == group:
                        t.changed.set()

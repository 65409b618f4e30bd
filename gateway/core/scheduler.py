"""The scheduler facade both drivers use: ``submit``, ``pop_next``, ``on_finish``, ``on_fail``, ``cancel``.

No clock and no RNG of its own (the RNG is injected), so the same calls give the same decisions; membership
may change at run time without changing a member's index (docs/architecture.md, "The scheduler and its calls")."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from gateway.core.dispatchers import DispatchView, Rng, get_dispatcher
from gateway.core.estimates import Estimator
from gateway.core.latency import LatencyModel
from gateway.core.policy import Policy, get_policy
from gateway.core.prefix import Holders, PrefixIndex, cached_tokens, match_holders
from gateway.core.profile import PerfProfile
from gateway.core.queues import QUEUES, LanedQueue
from gateway.core.samples import SampleLog, sample_of
from gateway.core.slo import stage_budget
from gateway.core.transfer import Interconnect, transfer_table
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec
from gateway.errors import NoEligibleWorker

__all__ = ["BEST_EFFORT_SHARE", "NoEligibleWorker", "Scheduler", "WorkerInfo"]

BEST_EFFORT_SHARE = 0.05
"""Default ``Scheduler.best_effort_share`` (the simulator's and the live ``admission.best_effort_share``)."""
SCAN_LIMIT = 4096
"""Queued calls up to which ``Scheduler.queued_due_after`` scans the queues."""


class Scheduler:
    """Global dispatch into per-worker queues, plus the estimates that drive it.

    ``rng``: injected randomness (``p2c``). ``prefix_caching``: a prefix-aware policy keeps a ``PrefixIndex`` per
    worker and counts what a worker is believed to hold out of the prefill. ``best_effort_share``: a worker starts
    a best-effort call only below this share of its slots in flight (vLLM does not preempt).
    """

    def __init__(
        self,
        workers: Sequence[WorkerInfo],
        policy: str | Policy,
        rng: Rng,
        *,
        alpha: float | None = None,
        ewma: float = 0.2,
        max_age_s: float = 600.0,
        prefix_caching: bool = False,
        best_effort_share: float = BEST_EFFORT_SHARE,
        interconnect: Interconnect | None = None,
    ) -> None:
        if not 0.0 < best_effort_share <= 1.0:
            raise ValueError(f"best_effort_share must be in (0, 1], got {best_effort_share}")
        self.best_effort_share = best_effort_share
        self.estimator = Estimator(workers, ewma=ewma, max_age_s=max_age_s)
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        entry = get_dispatcher(self.policy.dispatcher)
        self._dispatcher = entry.make(rng)
        self._caps = entry.capabilities
        self._fill = entry.capabilities.queue_len or entry.capabilities.kv_util
        # One view, refreshed for every call (no per-call allocation).
        self._view = DispatchView(self.estimator.rows, [])
        self.prefix_aware = prefix_caching and self.policy.prefix_aware
        self._prefix_credit = self.policy.prefix_credit
        self._holders: Holders = {}  # which workers hold each prefix key (the indexes below keep it)
        self.prefix_index: list[PrefixIndex] = (
            [PrefixIndex(w.profile.kv_capacity_tokens, self._holders, i) for i, w in enumerate(self.workers)]
            if self.prefix_aware
            else []
        )
        self._make_queue = QUEUES[self.policy.queue].family()
        self.queues: list[LanedQueue] = [self._make_queue() for _ in self.workers]
        self.alpha = self.policy.default_alpha if alpha is None else alpha
        self.eligible = [True] * len(self.workers)
        self.member = [True] * len(self.workers)
        self._all = list(range(len(self.workers)))
        self._n_eligible = len(self.workers)
        self._eligible_idx: list[int] | None = None  # ``eligible_workers()``, until eligibility changes
        self._role_idx: tuple[list[int], list[int]] | None = None  # (whole-call, prefill) workers, likewise
        self._members_idx: list[int] | None = None  # ``members()``, until membership changes
        self._member_runs: list[tuple[LatencyModel, int]] | None = None  # their profile groups' runs, as long
        self._seq = 0
        self._queued = 0  # calls in every worker queue: each push and each pop or removal counted here
        self._ref_cache: dict[tuple[int, int], float] = {}
        self.dispatch_counts: list[dict[str, int]] = [{} for _ in self.workers]
        self.samples: SampleLog | None = None
        """Completed calls per worker for the profile refit; None (off) until ``keep_samples``."""
        self.last_leg: Call | None = None
        """The prefill leg the last ``submit`` queued for a split call (None: it queued the call whole)."""
        self.interconnect = interconnect
        self.links: list[list[tuple[float, float]]] = []
        """Per (prefill worker, decode worker): a split call's KV transfer, (latency s, s per prompt token)."""
        self._links_changed()
        # A new cost object per membership (a partial compares by identity): templates' cost caches start afresh.
        self._cost = partial(self.reference_cost)

    @property
    def workers(self) -> list[WorkerInfo]:
        """The workers by index (the estimator's list), read-only."""
        return self.estimator.workers

    def members(self) -> list[int]:
        """Indices of the current workers, ascending (a shared list: read it only)."""
        idx = self._members_idx
        if idx is None:
            idx = [i for i, m in enumerate(self.member) if m]
            self._members_idx = idx
        return idx

    def eligible_workers(self) -> list[int]:
        """Indices of the workers taking new dispatches, ascending (a shared list: read it only)."""
        idx = self._eligible_idx
        if idx is None:
            ok = self.eligible
            idx = self._all if self._n_eligible == len(ok) else [i for i, e in enumerate(ok) if e]
            self._eligible_idx = idx
        return idx

    def _roles(self) -> tuple[list[int], list[int]]:
        """The eligible workers that run whole calls and split calls' decodes (roles ``colocated`` and ``decode``),
        and those that run split calls' prefills (role ``prefill``); shared lists: read them only."""
        r = self._role_idx
        if r is None:
            idx = self.eligible_workers()
            infos = self.workers
            pre = [w for w in idx if infos[w].role == "prefill"]
            r = self._role_idx = (idx if not pre else [w for w in idx if infos[w].role != "prefill"], pre)
        return r

    def add_worker(self, info: WorkerInfo, *, eligible: bool = True) -> int:
        """Give a new worker a slot (a freed one if any); returns its index."""
        free = next((i for i, m in enumerate(self.member) if not m), None)
        if free is None:
            self.estimator.add_worker(info)
            self.queues.append(self._make_queue())
            self.eligible.append(False)
            self.member.append(True)
            self.dispatch_counts.append({})
            w = len(self.workers) - 1
            if self.prefix_aware:
                self.prefix_index.append(PrefixIndex(info.profile.kv_capacity_tokens, self._holders, w))
        else:
            w = free
            self.queues[w] = self._make_queue()
            self.estimator.reset_worker(w, info)
            self.member[w] = True
            self.dispatch_counts[w] = {}
            if self.prefix_aware:
                self.prefix_index[w].clear()  # out of the reverse index too
                self.prefix_index[w] = PrefixIndex(info.profile.kv_capacity_tokens, self._holders, w)
            if self.samples is not None:
                self.samples.clear(w)
        self._membership_changed()
        self.set_eligible(w, eligible)
        return w

    def remove_worker(self, worker: int) -> None:
        """Free a worker's slot. The driver must have drained its queue and seen its last call return."""
        if not self.member[worker]:
            raise ValueError(f"worker {worker} is not a member")
        if len(self.queues[worker]) or self.estimator.loads[worker].inflight:
            raise RuntimeError(f"worker {self.workers[worker].name} still has queued or in-flight calls")
        self.member[worker] = False
        self.set_eligible(worker, False)
        self._membership_changed()

    def set_capacity(self, worker: int, capacity: int) -> None:
        """Change a member's concurrent-call count (the one way a worker's capacity changes)."""
        self.estimator.set_capacity(worker, capacity)

    def set_profile(self, worker: int, profile: PerfProfile, source: str = "refit") -> None:
        """Change a member's profile constants (the refit): its ratios restart, reference costs are recomputed."""
        if not self.member[worker]:
            raise ValueError(f"worker {worker} is not a member")
        self.estimator.set_profile(worker, profile, source)
        self._membership_changed()

    def keep_samples(self, window: int) -> SampleLog:
        """Start keeping the last ``window`` completed calls per worker (for the refit); returns the log."""
        if self.samples is None or self.samples.window != window:
            self.samples = SampleLog(window)
        return self.samples

    def _links_changed(self) -> None:
        self.links = transfer_table(self.workers, self.interconnect)

    def _membership_changed(self) -> None:
        self._links_changed()
        self._all = list(range(len(self.workers)))
        self._eligible_idx = None
        self._role_idx = None
        self._members_idx = None
        self._member_runs = None
        self._ref_cache = {}
        self._cost = partial(self.reference_cost)

    @property
    def alpha(self) -> float:
        """The WB balance parameter in [0, 1]."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {value}")
        self._alpha = value

    def reference_cost(self, kind: str, input_tokens: int, output_tokens: int) -> float:
        """Cluster-mean lone-request latency of a call, the unit of stage budgets (0 with no member)."""
        key = (input_tokens, output_tokens)
        v = self._ref_cache.get(key)
        if v is None:
            runs = self._member_runs
            if runs is None:
                runs = self._member_runs = self.estimator.group_runs(self.members())
            v = self.estimator.mean_base_latency_runs(runs, input_tokens, output_tokens)
            if len(self._ref_cache) < 65536:
                self._ref_cache[key] = v
        return v

    def set_tenant_weights(self, weights: dict[str, float]) -> None:
        """Tenants' share weights, for queue disciplines that use them (``vtc``); others ignore them."""
        for q in self.queues:
            q.set_tenant_weights(weights)

    def set_eligible(self, worker: int, eligible: bool) -> None:
        """Mark a worker as (in)eligible for new dispatches (health, draining); non-members never are."""
        self.eligible[worker] = eligible and self.member[worker]
        self._n_eligible = sum(self.eligible)
        self._eligible_idx = None
        self._role_idx = None

    def submit(self, call: Call, now: float) -> int:
        """Compute the call's stage budget, choose a worker, and queue the call there; returns that worker. Where
        the policy splits it (``Policy.split_threshold``; a call of one output token never is), its prefill leg is
        queued instead (a new ``Call`` with the same id, ``leg`` 1, its ``parent`` the call, ``decode_on`` the
        decode worker) and the prefill worker returned (and kept in ``last_leg``, None after a whole call): the
        driver runs the leg, then ``submit_decode``."""
        self._budget(call, now)
        self.last_leg = None
        if call.best_effort:
            w = self._choose_best_effort(call, now)
        else:
            whole, pre = self._roles()
            w = self._choose(call, now, whole)
            if pre and call.spec.output_tokens > 1:
                leg = self._split(call, w, pre, now)
                if leg is not None:
                    p = leg.worker
                    self._enqueue(leg, p, now)
                    self.last_leg = leg
                    return p
        self._enqueue(call, w, now)
        return w

    def _split(self, call: Call, w: int, pre: list[int], now: float) -> Call | None:
        """The prefill leg of ``call`` on its chosen prefill worker (``worker`` set) when the policy splits it to
        decode on ``w`` (whose estimates ``_choose`` just filled), else None."""
        policy = self.policy
        spec = call.spec
        th = policy.split_threshold
        if th is not None:
            if spec.input_tokens - call.cached <= th:
                return None
            leg = self._prefill_leg(call, w)
            leg.worker = self._choose(leg, now, pre)
            return leg
        if not policy.split_predicted:
            return None
        est = self.estimator
        row = est.rows[w]
        whole = row.t_queue + call.t_comp + row.harm
        leg = self._prefill_leg(call, w)
        p = self._choose(leg, now, pre, record=False)
        prow = est.rows[p]
        decode = est.t_comp(w, spec.kind, spec.input_tokens, spec.output_tokens, now, spec.input_tokens - 1)
        moved = self.transfer_s(p, w, spec.input_tokens - call.cached)  # (what the decode worker does not hold)
        split = prow.t_queue + leg.t_comp + prow.harm + moved + row.t_queue
        if split + decode >= whole:
            return None
        if self.prefix_aware and spec.prefix:
            self.prefix_index[p].record(leg.prefix_keys, now)
        leg.worker = p
        return leg

    def transfer_s(self, src: int, dst: int, tokens: int) -> float:
        """Seconds to move ``tokens`` prompt tokens' KV from worker ``src`` to ``dst`` (``links``)."""
        latency, per_token = self.links[src][dst]
        return latency + tokens * per_token if src != dst and tokens > 0 else 0.0

    def _prefill_leg(self, call: Call, decode_on: int) -> Call:
        """The prefill leg of ``call`` (its prompt and first token), to decode on ``decode_on``; budgeted as it."""
        s = call.spec
        leg = Call(call.id, call.workflow, CallSpec(s.kind, s.input_tokens, 1, s.prefix), call.ready_at, call.seq)
        leg.leg, leg.parent, leg.decode_on, leg._prefix_keys = 1, call, decode_on, call._prefix_keys
        leg.stage_cost, leg.remaining_cost, leg.budget = call.stage_cost, call.remaining_cost, call.budget
        return leg

    def submit_decode(self, leg: Call, now: float) -> Call:
        """A split call's prefill leg returned: queue its decode leg (the parent's spec, ``leg`` 2, its prompt
        counted as cached but for one token) on the worker chosen with the prefill, or, no longer eligible, on the
        best decode worker now; returns the decode leg."""
        parent = leg.parent
        if parent is None or leg.leg != 1:
            raise ValueError("submit_decode takes a split call's prefill leg")
        s = parent.spec
        dec = Call(parent.id, parent.workflow, s, now, parent.seq, leg=2, parent=parent)
        dec._prefix_keys = parent._prefix_keys
        self._budget(dec, now)
        whole, _ = self._roles()
        w = leg.decode_on
        if w not in whole:
            w = self._choose(dec, now, whole)
        dec.cached = max(s.input_tokens - 1, 0)
        dec.t_comp = self.estimator.t_comp(w, s.kind, s.input_tokens, s.output_tokens, now, dec.cached)
        self._enqueue(dec, w, now)
        return dec

    def _choose_best_effort(self, call: Call, now: float) -> int:
        """The worker where a best-effort call would be done soonest in its own lane (the policy is not asked)."""
        idx = self._roles()[0]
        if not idx:
            raise NoEligibleWorker("no eligible worker")
        est = self.estimator
        spec = call.spec
        best = idx[0]
        best_score = 0.0
        for i, w in enumerate(idx):
            load = est.loads[w]
            ahead = load.best_effort_queued + load.best_effort_inflight + 1
            score = ahead / self.best_effort_slots(w) * est.base_latency(w, spec.input_tokens, spec.output_tokens)
            if i == 0 or score < best_score:
                best, best_score = w, score
        call.t_comp = est.t_comp(best, spec.kind, spec.input_tokens, spec.output_tokens, now)
        call.cached = 0
        return best

    def _budget(self, call: Call, now: float) -> None:
        """The call's stage budget and submission order."""
        wf = call.workflow
        call.stage_cost = wf.stage_cost(call.spec, self._cost)
        call.remaining_cost = wf.expected_remaining(self._cost)
        call.budget = stage_budget(wf.deadline, now, call.stage_cost, call.remaining_cost)
        call.ready_at = now
        self._seq += 1
        call.seq = self._seq

    def abandon(self, call: Call, now: float) -> None:
        """Forget a call whose answer is no longer wanted: off its queue, or its slot freed without learning."""
        if self.cancel(call):
            return
        if call.started_at is not None and call.finished_at is None:
            self._release(call, now)
            call.finished_at = now

    def _choose(self, call: Call, now: float, idx: list[int] | None = None, *, record: bool = True) -> int:
        est = self.estimator
        spec = call.spec
        if idx is None:
            idx = self._roles()[0]
        if not idx:
            raise NoEligibleWorker("no eligible worker")
        keys = call.prefix_keys if self.prefix_aware and spec.prefix else None
        if keys is not None:
            self._match_prefix(keys, idx, spec.input_tokens, now)
        view = self._view
        view.t_comp_min = est.scan(
            idx, spec.kind, spec.input_tokens, spec.output_tokens, now, credited=keys is not None
        )
        if self._fill:
            self._fill_rows(idx)
        view.rows = est.rows
        view.workers = idx
        view.alpha = self._alpha
        view.budget = call.budget
        view.input_tokens = spec.input_tokens
        view.prefix = keys is not None
        w = idx[self._dispatcher.choose(view)]
        row = est.rows[w]
        call.t_comp = row.t_comp
        if keys is not None:
            call.cached = row.cached
            if row.credit != row.cached:
                call.t_comp = est.t_comp(w, spec.kind, spec.input_tokens, spec.output_tokens, now, row.cached)
            # Usable from now on by later calls to this worker: vLLM caches a block when it schedules it.
            if record:
                self.prefix_index[w].record(keys, now)
        else:
            call.cached = 0
        return w

    def _match_prefix(self, keys: list[tuple[int, int]], idx: list[int], n_in: int, now: float) -> None:
        """Fill ``idx``'s rows' ``cached`` (tokens each worker holds) and ``credit`` (scaled by the policy's)."""
        est = self.estimator
        rows = est.rows
        k = self._prefix_credit
        top = n_in - 1
        for w in idx:
            row = rows[w]
            row.cached = 0
            row.credit = 0
        # Every worker's ``PrefixIndex.match`` at once (rows outside ``idx`` may be written, never read).
        infos = est.workers
        for w, m in match_holders(self._holders, keys, now).items():
            c = cached_tokens(m, n_in, infos[w].profile.block_tokens)
            if c:
                row = rows[w]
                row.cached = c
                row.credit = c if k == 1.0 else min(int(c * k), top)

    def _fill_rows(self, idx: list[int]) -> None:
        """The row fields only some dispatchers read: queue length, KV utilisation."""
        est = self.estimator
        rows = est.rows
        loads = est.loads
        workers = est.workers
        if self._caps.queue_len:
            for w in idx:
                rows[w].queued = loads[w].queued
        if self._caps.kv_util:
            for w in idx:
                rows[w].kv_util = loads[w].inflight_kv / workers[w].profile.kv_capacity_tokens

    def _enqueue(self, call: Call, w: int, now: float) -> None:
        call.worker = w
        self.estimator.enqueue(call, w)
        self.queues[w].push(call)
        self._queued += 1
        counts = self.dispatch_counts[w]
        counts[call.kind] = counts.get(call.kind, 0) + 1

    def best_effort_slots(self, worker: int) -> int:
        """``worker`` starts a best-effort call only below this many in flight: a share of capacity, at least 1."""
        n = int(self.workers[worker].capacity * self.best_effort_share)
        return n if n > 1 else 1

    def pop_next(self, worker: int, now: float) -> Call | None:
        """The next call for ``worker`` by its discipline (best effort only below its slots); marks it in flight."""
        load = self.estimator.loads[worker]
        low = load.best_effort_queued > 0 and load.inflight < self.best_effort_slots(worker)
        call = self.queues[worker].pop(now, low)
        if call is None:
            return None
        self._queued -= 1
        est = self.estimator
        est.dequeue(call, worker)
        est.start(call, worker, now)
        call.started_at = now
        return call

    def _release(self, call: Call, now: float) -> None:
        self.estimator.release(call, call.worker, now)

    def on_finish(
        self, call: Call, now: float, observed_s: float | None = None, tokens: tuple[int, int] | None = None
    ) -> None:
        """A call returned: free its slot, correct the estimator (``tokens``: what it processed, if not its spec's)."""
        self._release(call, now)
        call.finished_at = now
        if observed_s is None and call.started_at is not None:
            observed_s = now - call.started_at
        if observed_s is not None:
            self.estimator.observe(call, observed_s, now, tokens)
            if self.samples is not None and call.batch_n:
                w = call.worker
                self.samples.add(w, sample_of(call, self.workers[w].profile, observed_s, now))

    def on_fail(self, call: Call, now: float) -> None:
        """A call failed on its worker: free the slot. The driver decides whether to resubmit."""
        self._release(call, now)
        call.started_at = None
        call.attempts += 1

    def cancel(self, call: Call) -> bool:
        """Take a queued call off its worker's queue; False when it is not queued."""
        if call.worker < 0 or call.started_at is not None:
            return False
        if not self.queues[call.worker].remove(call):
            return False
        self._queued -= 1
        self.estimator.dequeue(call, call.worker)
        return True

    def drain_worker(self, worker: int) -> list[Call]:
        """Take every queued call off a worker (it left or went down) so the driver can resubmit them."""
        out = list(self.queues[worker])
        for c in out:
            self.cancel(c)
        return out

    def queued_due_after(
        self, deadline: float, limit: int = SCAN_LIMIT
    ) -> dict[int, tuple[int, float, float, float]] | None:
        """Per worker with any: the (calls, prefill s, engine s, ``t_comp`` s) queued on it, not best effort, whose
        workflow is due after ``deadline``. None when more than ``limit`` are queued (count all as ahead)."""
        if self._queued > limit:
            return None
        out: dict[int, tuple[int, float, float, float]] = {}
        for w, q in enumerate(self.queues):
            n = 0
            pre = gpu = work = 0.0
            for c in q:
                if not c.best_effort and c.workflow.deadline > deadline:
                    n += 1
                    pre += c.prefill_s
                    gpu += c.gpu_s
                    work += c.t_comp
            if n:
                out[w] = (n, pre, gpu, work)
        return out

    def queue_len(self, worker: int) -> int:
        """Calls waiting in the worker's gateway queue."""
        return len(self.queues[worker])

    def queued_total(self) -> int:
        """Calls waiting in every worker's gateway queue, in O(1)."""
        return self._queued

    def inflight(self, worker: int) -> int:
        """Calls sent to the worker and not yet returned."""
        return self.estimator.loads[worker].inflight

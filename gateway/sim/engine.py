"""The simulated vLLM engine: iteration-level continuous batching with chunked prefill, KV limits and prefix
caching, advanced in segments of identical iterations (docs/architecture.md, "The simulated engine")."""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from gateway.core.prefix import Key, cached_tokens
from gateway.core.profile import PerfProfile, iterations_within
from gateway.core.workflow import Call


class _Running:
    """A call in the engine: waiting, prefilling or decoding (not a dataclass: see ``Call.__init__``)."""

    __slots__ = (
        "admitted_at",
        "call",
        "finish_d",
        "held",
        "hit",
        "hold_kv",
        "join_d",
        "keys",
        "kv",
        "order",
        "out_tokens",
        "prefill_done_at",
        "priority",
        "prompt_left",
        "remote",
        "stored_from",
    )

    def __init__(self, call: Call, prompt_left: int, out_tokens: int, kv: int, priority: int, order: int) -> None:
        self.call = call
        self.prompt_left = prompt_left
        self.out_tokens = out_tokens
        self.kv = kv
        self.finish_d = 0
        self.admitted_at: float | None = None
        self.join_d = -1  # decode counter when the prompt finished (-1: still waiting or prefilling)
        self.prefill_done_at: float | None = None
        self.priority = priority
        self.order = order
        self.keys: list[tuple[Key, int]] = []  # the prompt's shared segments (caching on)
        self.held: list[Key] = []  # cache entries this call pins while it runs
        self.hit = 0  # prompt tokens served from the cache
        self.stored_from = 0  # held[stored_from:]: the segments this call brought into the cache
        self.hold_kv = False  # a split call's prefill: its KV stays reserved after it finishes, until ``release``
        # A split call's decode: (latency, seconds per token) of the link its KV arrives over (None: not remote).
        self.remote: tuple[float, float] | None = None


@dataclass(slots=True)
class EngineStats:
    """Counters for invariant checks and reports (token counts; ``seq_iterations``: batch sizes summed)."""

    iterations: int = 0
    max_running: int = 0
    max_kv: int = 0
    busy_s: float = 0.0
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    evicted_tokens: int = 0
    cancelled: int = 0
    batched_tokens: int = 0
    seq_iterations: int = 0
    loaded_tokens: int = 0
    """Prompt tokens whose KV a split call's decode received from its prefill engine."""
    max_held_kv: int = 0
    """Most KV tokens held at once for split calls' transfers after their prefill finished."""


@dataclass(eq=False)
class SimEngine:
    """One simulated vLLM server: the simulator calls ``add``, ``kick`` and ``on_wake``. ``priority_scheduling``:
    waiting calls by (priority, arrival), as vLLM's ``--scheduling-policy priority`` (no preemption).

    Split calls (prefill/decode disaggregation, as vLLM's KV connectors run them): a prefill (``add(...,
    prefill_only=True)``) stops after its first token and keeps its KV reserved until ``release``; a decode
    (``add(..., remote=(latency, s_per_token))``) takes a slot and its whole KV at admission, then waits while the
    prompt's KV not in its own prefix cache arrives (``started_loads`` says when) and joins the decoding batch at
    ``loaded``."""

    profile: PerfProfile
    index: int = 0
    waiting: deque[_Running] = field(default_factory=deque)
    stats: EngineStats = field(default_factory=EngineStats)
    priority_scheduling: bool = False
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        p = self.profile
        self._base = p.iter_base_s
        self._tok = p.token_s
        self._ctx = p.ctx_s
        self._attn = p.attn_s
        self._seq_s = p.seq_s
        self._admit_s = p.admit_s
        self._intake = 0.0  # admit_s of the calls admitted since the last plan: stalls the next iteration
        self._seg_intake = 0.0  # the intake in the planned segment's first iteration
        self._block = p.block_tokens
        self._prefill: deque[_Running] = deque()
        self._prefill_left = 0
        self._decode: list[tuple[int, int, _Running]] = []
        self._d = 0  # decode iterations so far (decoders advance one token per iteration)
        self._ctx_total = 0.0  # context tokens held by running calls
        self._kv_used = 0
        self._running = 0
        self._seq = 0
        self._order = 0
        self._states: dict[int, _Running] = {}
        self._cancel_at_wake: list[_Running] = []
        self._loading: dict[int, _Running] = {}  # split decodes admitted, their KV still arriving
        self._loads: list[tuple[Call, float]] = []  # loads started since ``started_loads`` was last asked
        self._joined: list[_Running] = []  # loaded while a segment ran: they join the batch at its end
        self._held_kv: dict[int, int] = {}  # finished split prefills' KV, kept for their transfer
        self._held_total = 0
        # Prefix cache: key -> [tokens, running calls holding it], least recently used first.
        self._cache: OrderedDict[Key, list[int]] = OrderedDict()
        self._evictable = 0  # tokens of cache entries no running call holds (they live in free KV)
        # Current segment (valid while busy).
        self.busy = False
        self.version = 0
        self._seg_start = 0.0
        self._seg_k = 0
        self._seg_tok = 0  # prompt tokens per iteration in this segment
        self._seg_first = 0.0  # duration of the segment's first iteration
        self._seg_growth = 0.0  # duration growth per iteration
        self._seg_gctx = 0  # context growth per iteration
        self.wake_at = 0.0

    @property
    def running(self) -> int:
        """Calls admitted into the batch (prefilling or decoding, or split decodes whose KV is arriving)."""
        return self._running

    @property
    def kv_used(self) -> int:
        """KV-cache tokens reserved by running calls."""
        return self._kv_used

    def add(
        self,
        call: Call,
        priority: int = 0,
        *,
        prefill_only: bool = False,
        remote: tuple[float, float] | None = None,
    ) -> None:
        """Put a call into the engine's waiting queue; ``kick`` afterwards to let it in. ``prefill_only``: a split
        call's prefill (its first token; KV kept until ``release``); ``remote``: a split call's decode, its KV
        arriving over a link of (latency s, s per token)."""
        s = call.spec
        n_in = s.input_tokens if s.input_tokens > 1 else 1
        n_out = s.output_tokens if s.output_tokens > 1 else 1
        if prefill_only:
            if remote is not None:
                raise ValueError("a call is either a split call's prefill or its decode")
            n_out = 1
        elif remote is not None and n_out < 2:
            raise ValueError("a split call's decode needs at least 2 output tokens (the prefill gave the first)")
        self._order += 1
        r = _Running(call, n_in, n_out, n_in + n_out, priority=priority, order=self._order)
        r.hold_kv = prefill_only
        r.remote = remote
        if self.prefix_caching and s.prefix:
            r.keys = call.prefix_keys
        self._states[call.id] = r
        w = self.waiting
        if self.priority_scheduling and w and (priority, r.order) < (w[-1].priority, w[-1].order):
            items = sorted([*w, r], key=lambda x: (x.priority, x.order))
            w.clear()
            w.extend(items)
        else:
            w.append(r)

    def progress(self, call: Call, now: float) -> tuple[int, float | None]:
        """Output tokens ``call`` has produced by ``now`` (exact at iteration boundaries), and when its first token
        came (None: not yet)."""
        r = self._states.get(call.id)
        if r is None or r.prefill_done_at is None:
            return 0, None
        d = self._d
        if self.busy and self._seg_gctx:
            k = iterations_within(self._seg_first, self._seg_growth, now - self._seg_start)
            d += min(k, self._seg_k)
        return min(r.out_tokens, 1 + max(d - r.join_d, 0)), r.prefill_done_at

    def call_state(self, call: Call) -> tuple[float | None, float | None]:
        """(admitted at, first token at) in model time for a call still in the engine; None: not yet."""
        r = self._states.get(call.id)
        if r is None:
            return None, None
        return r.admitted_at, r.prefill_done_at

    def cached_of(self, call: Call) -> int:
        """Prompt tokens of ``call`` served from the prefix cache (vLLM's ``num_cached_tokens``): set at
        admission; 0 while it waits, without prefix caching, or once it has left the engine."""
        r = self._states.get(call.id)
        return r.hit if r is not None else 0

    def remove(self, call: Call) -> bool:
        """Drop a call that is still waiting (a client went away); running calls run to completion."""
        for r in self.waiting:
            if r.call is call:
                self.waiting.remove(r)
                self._states.pop(call.id, None)
                return True
        return False

    def cancel(self, call: Call, now: float) -> bool:
        """Abort ``call``: a waiting call leaves the queue, a running one the batch at the next iteration boundary.
        True when a new wake-up time was set, as ``kick``."""
        r = self._states.get(call.id)
        if r is None:
            return False
        if r.admitted_at is None:
            self.remove(call)
            return False
        if not self.busy:
            self._drop(r)
            return False  # the simulator replans with ``kick`` after its wake-up, as after ``on_wake``
        t = self._cut(now)
        if t < 0.0:
            self._cancel_at_wake.append(r)  # the segment ends first: drop it then
            return False
        self._drop(r)
        self.busy = False
        if self._plan(t):
            return True
        self.version += 1  # nothing left to run: the planned wake-up is void
        return False

    def _drop(self, r: _Running) -> None:
        """Take a running call out of the batch: its context, KV, slot and cache pins."""
        n_in = r.kv - r.out_tokens
        if r.remote is not None and r.join_d < 0:  # a split decode whose KV is still arriving
            self._loading.pop(r.call.id, None)
            if r in self._joined:
                self._joined.remove(r)
            ctx = 0
        elif r.join_d < 0:  # still prefilling
            self._prefill.remove(r)
            self._prefill_left -= r.prompt_left
            ctx = n_in - r.prompt_left
        else:
            dec = self._decode
            for i, item in enumerate(dec):
                if item[2] is r:
                    dec[i] = dec[-1]
                    dec.pop()
                    heapq.heapify(dec)
                    break
            ctx = n_in + (self._d - r.join_d)
        self._leave(r, ctx)
        if r.join_d < 0 and r.keys:
            # Its prompt was never finished: the segments it brought into the cache are not computed. Those no
            # other call holds are forgotten (one a later call holds stays: that call reads it already).
            cache = self._cache
            for key, _ in r.keys[r.stored_from :]:
                e = cache.get(key)
                if e is not None and not e[1]:
                    del cache[key]
                    self._evictable -= e[0]
        self.stats.cancelled += 1

    def kick(self, now: float) -> bool:
        """Replan after ``add``: start if idle, or cut the running segment at the next boundary. True when a new
        wake-up time was set (``wake_at``, with a new ``version``)."""
        if not self.busy:
            return self._plan(now)
        if not self._can_admit():
            return False  # nothing could enter at the next boundary anyway
        t = self._cut(now)
        return t >= 0.0 and self._plan(t)  # (the segment ending first: admission happens then)

    def _cut(self, now: float) -> float:
        """Apply the running segment up to the first iteration boundary at or after ``now`` (mid-iteration: when the
        current iteration ends) and return its time; -1.0 when the segment ends first (nothing applied)."""
        elapsed = now - self._seg_start
        k = iterations_within(self._seg_first, self._seg_growth, elapsed)
        if self._seg_time(k) < elapsed:
            k += 1
        if k >= self._seg_k:
            return -1.0
        t = self._seg_start + self._seg_time(k)
        self._apply(k, t)
        return t

    def on_wake(self, now: float) -> list[Call]:
        """The planned segment ended at ``now``: apply it and return the calls that finished (the engine is left
        unplanned until ``kick``)."""
        done = self._apply(self._seg_k, now)
        self.busy = False
        if self._joined:
            for r in self._joined:
                self._join(r, now)
            self._joined.clear()
        if self._cancel_at_wake:
            for r in self._cancel_at_wake:
                if r.call.id in self._states:  # not finished in the segment
                    self._drop(r)
            self._cancel_at_wake.clear()
        return done

    def _can_admit(self) -> bool:
        if not self.waiting or self._running >= self.profile.max_num_seqs:
            return False
        alone = self._running == 0 and not self._held_total
        return self._kv_used + self.waiting[0].kv <= self.profile.kv_capacity_tokens or alone

    def _seg_time(self, k: int) -> float:
        return k * self._seg_first + self._seg_growth * k * (k - 1) / 2.0

    def _admit(self, now: float) -> None:
        cap = self.profile.kv_capacity_tokens
        max_seqs = self.profile.max_num_seqs
        while self.waiting and self._running < max_seqs:
            r = self.waiting[0]
            # A call larger than the whole cache still runs alone rather than deadlocking the engine (once the KV
            # held for transfers is released).
            if self._kv_used + r.kv > cap and (self._running > 0 or self._held_total):
                break
            self.waiting.popleft()
            r.admitted_at = now
            self._intake += self._admit_s
            if r.remote is None:
                self.stats.prompt_tokens += r.prompt_left
            if r.keys:
                self._hit(r)
                self._store(r)
            if r.remote is None:
                self._prefill.append(r)
                self._prefill_left += r.prompt_left
            else:
                self._start_load(r, now, r.remote)
            self._kv_used += r.kv
            self._running += 1
        st = self.stats
        if self._running > st.max_running:  # noqa: PLR1730 (hot path: no builtin call)
            st.max_running = self._running
        if self._kv_used > st.max_kv:  # noqa: PLR1730
            st.max_kv = self._kv_used
        if self._evictable > cap - self._kv_used:
            self._evict(cap - self._kv_used)

    def _start_load(self, r: _Running, now: float, link: tuple[float, float]) -> None:
        """A split call's decode admitted at ``now``: the prompt's KV not in the cache starts arriving over ``link``."""
        tokens = r.prompt_left
        self._ctx_total -= r.hit  # (its cached prefix is context from the join on)
        self.stats.loaded_tokens += tokens
        r.prompt_left = 0
        self._loading[r.call.id] = r
        self._loads.append((r.call, now + link[0] + tokens * link[1] if tokens > 0 else now))

    def started_loads(self) -> list[tuple[Call, float]]:
        """The split decodes admitted since last asked, each with when its KV will have arrived (the simulator
        calls ``loaded`` then)."""
        out, self._loads = self._loads, []
        return out

    def loaded(self, call: Call, now: float) -> bool:
        """A split call's KV arrived at ``now``: it joins the decoding batch at the next iteration boundary. True
        when a new wake-up time was set, as ``kick``."""
        r = self._loading.pop(call.id, None)
        if r is None:
            return False
        if not self.busy:
            self._join(r, now)
            return self._plan(now)
        t = self._cut(now)
        if t < 0.0:
            self._joined.append(r)  # the segment ends first: it joins then (``on_wake``)
            return False
        self._join(r, t)
        self.busy = False
        return self._plan(t)

    def _join(self, r: _Running, now: float) -> None:
        """A split call's decode starts at ``now``: its prompt is context, its first token came from the prefill."""
        r.prefill_done_at = now
        r.join_d = self._d
        self._ctx_total += r.kv - r.out_tokens
        r.finish_d = self._d + r.out_tokens - 1
        self._seq += 1
        heapq.heappush(self._decode, (r.finish_d, self._seq, r))

    def release(self, call: Call) -> bool:
        """A split call's KV reached its decode engine: the KV its prefill kept here is freed. True when calls wait
        that it may let in (``kick`` then)."""
        kv = self._held_kv.pop(call.id, None)
        if kv is None:
            return False
        self._kv_used -= kv
        self._held_total -= kv
        return bool(self.waiting)

    @property
    def held_kv(self) -> int:
        """KV tokens kept for split calls' transfers after their prefill finished."""
        return self._held_total

    def _hit(self, r: _Running) -> None:
        """At admission: pin the cached leading segments of ``r``'s prompt and skip their prefill."""
        cache = self._cache
        matched = 0
        for key, tokens in r.keys:
            e = cache.get(key)
            if e is None:
                break
            if not e[1]:
                self._evictable -= e[0]
            e[1] += 1
            cache.move_to_end(key)
            r.held.append(key)
            matched += tokens
        hit = cached_tokens(matched, r.prompt_left, self._block)
        if hit:
            r.hit = hit
            r.prompt_left -= hit
            self._ctx_total += hit  # the cached prefix is context the call's iterations read
            self.stats.prefix_hit_tokens += hit

    def _store(self, r: _Running) -> None:
        """At admission, after ``_hit``: the rest of ``r``'s segments are cached from now on, pinned by ``r`` until
        it finishes (vLLM caches a block when it schedules it, and later calls prefill behind ``r``)."""
        cache = self._cache
        held = r.held
        r.stored_from = len(held)
        for key, tokens in r.keys[len(held) :]:
            e = cache.get(key)
            if e is None:
                cache[key] = [tokens, 1]
            else:
                if not e[1]:
                    self._evictable -= e[0]
                e[1] += 1
                cache.move_to_end(key)
            held.append(key)

    def _unpin(self, r: _Running) -> None:
        cache = self._cache
        for key in r.held:
            e = cache[key]
            e[1] -= 1
            if not e[1]:
                self._evictable += e[0]
        r.held = []

    def _evict(self, room: int) -> None:
        """Evict unpinned entries, least recently used first, until they fit in ``room`` free tokens."""
        cache = self._cache
        victims = []
        total = self._evictable
        for key, e in cache.items():
            if total <= room:
                break
            if not e[1]:
                victims.append(key)
                total -= e[0]
        for key in victims:
            tokens = cache.pop(key)[0]
            self._evictable -= tokens
            self.stats.evicted_tokens += tokens

    @property
    def evictable_tokens(self) -> int:
        """Cached tokens no running call holds (they occupy free KV space)."""
        return self._evictable

    def _plan(self, now: float) -> bool:
        self._admit(now)
        if self._running == 0 or (not self._prefill and not self._decode):  # (or only split decodes' KV arriving)
            self.busy = False
            return False
        b = len(self._decode)
        k = 1 << 62
        tok = 0
        if self._prefill:
            budget = self.profile.max_batched_tokens - b
            if budget > 0:
                head = self._prefill[0].prompt_left
                k_pre = -(-head // budget)
                if self._prefill_left >= k_pre * budget:
                    k, tok = k_pre, budget
                    if self._attn and k > 1 and head % budget:
                        # The last iteration ends the head prompt and starts the next, whose chunk attends
                        # to its own (short) prefix: a segment of its own, counted exactly.
                        k -= 1
                elif k_pre > 1:
                    k, tok = k_pre - 1, budget
                else:
                    k, tok = 1, self._prefill_left
        if b:
            k = min(k, self._decode[0][0] - self._d)
        if k <= 0 or k == 1 << 62:
            k = 1
        intake = self._intake
        if intake:
            # The admitting iteration is stalled by the new calls' intake: a segment of its own.
            k = 1
            self._intake = 0.0
        tokens = b + tok
        self._seg_tok = tok
        self._seg_gctx = tokens
        self._seg_first = self._base + self._tok * tokens + self._ctx * self._ctx_total + self._seq_s * b
        self._seg_growth = self._ctx * tokens
        if tok and self._attn:
            self._add_attention(tok)
        self._seg_first += intake
        self._seg_intake = intake
        self._seg_k = k
        self._seg_start = now
        self.busy = True
        self.version += 1
        self.wake_at = now + self._seg_time(k)
        return True

    def _add_attention(self, tok: int) -> None:
        """Add the prefill attention pairs of the segment's iterations to its timing (``attn_s``)."""
        pairs = 0.0
        left = tok
        for r in self._prefill:  # the first iteration's chunks, exactly
            pos = r.kv - r.out_tokens - r.prompt_left  # prompt tokens already processed (or cached)
            c = r.prompt_left if r.prompt_left < left else left
            pairs += c * pos + c * (c + 1) / 2.0
            left -= c
            if not left:
                break
        self._seg_first += self._attn * pairs
        self._seg_growth += self._attn * tok * tok  # each next chunk starts tok tokens further in

    def _apply(self, k: int, now: float) -> list[Call]:
        """Advance k iterations of the current segment, ending at ``now``."""
        if self._seg_intake:
            if not k:  # replanned before its first iteration ran: the intake is still to come
                self._intake += self._seg_intake
            self._seg_intake = 0.0
        st = self.stats
        st.iterations += k
        st.busy_s += now - self._seg_start
        st.batched_tokens += k * self._seg_gctx
        st.seq_iterations += k * self._running
        self._d += k
        self._ctx_total += k * self._seg_gctx
        done: list[Call] = []
        consume = k * self._seg_tok
        if consume:
            self._prefill_left -= consume
            pre = self._prefill
            while consume and pre:
                r = pre[0]
                if r.prompt_left > consume:
                    r.prompt_left -= consume
                    break
                consume -= r.prompt_left
                r.prompt_left = 0
                pre.popleft()
                # The last prompt chunk yields the first output token.
                r.prefill_done_at = now
                r.join_d = self._d
                left = r.out_tokens - 1
                if left <= 0:
                    self._finish(r, done)
                else:
                    r.finish_d = self._d + left
                    self._seq += 1
                    heapq.heappush(self._decode, (r.finish_d, self._seq, r))
        dec = self._decode
        while dec and dec[0][0] <= self._d:
            _, _, r = heapq.heappop(dec)
            self._finish(r, done)
        return done

    def _finish(self, r: _Running, done: list[Call]) -> None:
        # prompt (kv - out) plus the out - 1 decoded tokens
        self._leave(r, r.kv - 1)
        if r.hold_kv:  # a split call's prefill: its KV stays until its decode engine has it (``release``)
            self._kv_used += r.kv
            self._held_kv[r.call.id] = r.kv
            self._held_total += r.kv
            if self._held_total > self.stats.max_held_kv:  # noqa: PLR1730 (hot path: no builtin call)
                self.stats.max_held_kv = self._held_total
        done.append(r.call)

    def _leave(self, r: _Running, ctx: int) -> None:
        """``r`` leaves the batch holding ``ctx`` context tokens: its context, KV, slot and cache pins."""
        self._ctx_total -= ctx
        if self._ctx_total < 0.5:
            self._ctx_total = 0.0
        self._kv_used -= r.kv
        self._running -= 1
        if r.held:
            self._unpin(r)
        self._states.pop(r.call.id, None)

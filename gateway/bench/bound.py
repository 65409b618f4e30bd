"""The fluid bound: the highest workflow rate any scheduler could sustain on a cluster, as a linear program
over the engines' own limits (GPU time, batch slots, batched tokens, KV cache) per worker and call type, each
call type at its least use of each (buckets of types at their members' least: still a relaxation). The
program and the per-call bounds: docs/benchmarks.md "The fluid bound"."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from gateway.core.prefix import best_case_cached
from gateway.core.profile import PerfProfile
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec

MAX_GROUPS = 2000
"""Distinct call types solved exactly; more are merged into geometric buckets."""

_ROWS = 4  # constraints per worker: GPU time, slots, batched tokens, KV


@dataclass(frozen=True)
class FluidBound:
    """The solved program: the largest sustainable workflow rate (workflows/s), and per worker at it: calls/s
    served, fraction of time busy (1.0: the worker limits it), that busy time split per engine into
    per-iteration base, tokens and the rest (context, prefill attention, per-call host work), and calls in the
    batch per iteration; ``groups``: call types (or buckets) in the program."""

    rate_qps: float
    calls_per_s: tuple[float, ...]
    gpu_busy: tuple[float, ...]
    groups: int
    time_split: tuple[tuple[float, float, float], ...] = ()
    seqs_per_iteration: tuple[float, ...] = ()


def call_resources(
    profile: PerfProfile, n_in: np.ndarray, n_out: np.ndarray, n_cached: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Per-call minimum resource use on an engine: ``gpu_s`` (token and context time, no iteration base),
    ``iters`` (iterations holding a slot), ``tokens`` (batched tokens) and ``kv_iters`` (KV token-iterations).
    Token counts are clamped to at least 1; ``n_cached`` prompt tokens come from the prefix cache (not
    prefilled, but read as context by every iteration)."""
    i = np.maximum(n_in, 1).astype(np.float64)
    o = np.maximum(n_out, 1).astype(np.float64)
    h = np.zeros_like(i) if n_cached is None else np.minimum(np.asarray(n_cached, dtype=np.float64), i - 1.0)
    p = i - h
    chunk = float(profile.max_batched_tokens)
    k = np.ceil(p / chunk)
    prefill_ctx = h * k + (k - 1.0) * p - chunk * (k - 1.0) * k / 2.0
    n = o - 1.0
    decode_ctx = n * i + n * (n - 1.0) / 2.0
    tokens = p + n
    iters = k + n
    kv = np.minimum(i + o, float(profile.kv_capacity_tokens))
    return {
        "gpu_s": profile.token_s * tokens
        + profile.ctx_s * (prefill_ctx + decode_ctx)
        + profile.attn_s * (i * (i + 1.0) - h * (h + 1.0)) / 2.0
        + profile.seq_s * n,
        "iters": iters,
        "tokens": tokens,
        "kv_iters": kv * iters,
    }


def _groups(
    calls: Counter[tuple[int, int, int]], max_groups: int, bucket_ratio: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(inputs, outputs, cached, counts, group index) of the distinct call types; the group index maps each
    type to its bucket (identity when there are at most ``max_groups`` types)."""
    keys = sorted(calls)
    n_in = np.array([k[0] for k in keys], dtype=np.int64)
    n_out = np.array([k[1] for k in keys], dtype=np.int64)
    n_cached = np.array([k[2] for k in keys], dtype=np.int64)
    counts = np.array([calls[k] for k in keys], dtype=np.float64)
    if len(keys) <= max_groups:
        return n_in, n_out, n_cached, counts, np.arange(len(keys))
    step = math.log(bucket_ratio)
    bi = np.floor(np.log(np.maximum(n_in, 1)) / step).astype(np.int64)
    bo = np.floor(np.log(np.maximum(n_out, 1)) / step).astype(np.int64)
    bc = np.floor(np.log(np.maximum(n_in - n_cached, 1)) / step).astype(np.int64)
    _, group = np.unique(np.stack([bi, bo, bc], axis=1), axis=0, return_inverse=True)
    return n_in, n_out, n_cached, counts, group.reshape(-1)


def _mix(
    workers: Sequence[WorkerInfo], queries: Sequence[Sequence[CallSpec]], prefix_caching: bool
) -> Counter[tuple[int, int, int]]:
    """The calls of ``queries`` counted by (input, output, cached tokens)."""
    mix: Counter[tuple[int, int, int]] = Counter()
    block = min(w.profile.block_tokens for w in workers)  # the finest block serves the most
    for q in queries:
        hits = best_case_cached([(c.prefix, c.input_tokens) for c in q], block) if prefix_caching else [0] * len(q)
        mix.update((c.input_tokens, c.output_tokens, h) for c, h in zip(q, hits, strict=True))
    return mix


def _engines(workers: Sequence[WorkerInfo], engines: Sequence[int] | None, bucket_ratio: float) -> list[int]:
    """The checked engine count of each entry of ``workers``."""
    if not workers:
        raise ValueError("the fluid bound needs at least one worker")
    mult = [1] * len(workers) if engines is None else [int(n) for n in engines]
    if len(mult) != len(workers):
        raise ValueError(f"engines has {len(mult)} entries for {len(workers)} workers")
    if any(n < 1 for n in mult):
        raise ValueError(f"engines must be at least 1 each, got {list(mult)}")
    if not bucket_ratio > 1.0:
        raise ValueError(f"bucket_ratio must be > 1, got {bucket_ratio}")
    return mult


def _capacity_rows(
    workers: Sequence[WorkerInfo], types: tuple[np.ndarray, np.ndarray, np.ndarray], group: np.ndarray, n_g: int
) -> tuple[coo_matrix, list[dict[str, np.ndarray]]]:
    """The ``_ROWS`` inequality rows of every worker (GPU time, slots, batched tokens, KV) over the variables
    ``[lambda, x[w, g] (row-major), I[w]]``, and per worker each group's least use of each resource."""
    n_w = len(workers)
    n_x = n_w * n_g
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    g_idx = np.arange(n_g)
    per_call: list[dict[str, np.ndarray]] = []
    for w, info in enumerate(workers):
        p = info.profile
        res = call_resources(p, *types)
        x_cols = 1 + w * n_g + g_idx
        i_col = np.array([1 + n_x + w])
        limits = (
            ("gpu_s", 1.0, p.iter_base_s),
            ("iters", float(p.max_num_seqs), -1.0),
            ("tokens", float(max(p.max_batched_tokens, p.max_num_seqs)), -1.0),
            ("kv_iters", float(p.kv_capacity_tokens), -1.0),
        )
        per_call.append({})
        for r, (key, scale, i_coef) in enumerate(limits):
            # A bucket uses the least any of its members uses (a relaxation: still a bound).
            least = np.full(n_g, np.inf)
            np.minimum.at(least, group, res[key])
            per_call[w][key] = least
            row = _ROWS * w + r
            coef = least / scale if r else least
            rows += [np.full(n_g, row), np.array([row])]
            cols += [x_cols, i_col]
            vals += [coef, np.array([i_coef])]
    shape = (_ROWS * n_w, 1 + n_x + n_w)
    return coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape), per_call


def _solution(
    workers: Sequence[WorkerInfo],
    mult: list[int],
    x: np.ndarray,
    iters_per_s: np.ndarray,
    per_call: list[dict[str, np.ndarray]],
) -> tuple[list[float], list[tuple[float, float, float]], list[float]]:
    """Per worker at the solution: the busy fraction per engine, its split (base, tokens, the rest) and the calls
    per iteration."""
    busy, split, seqs = [], [], []
    for w, info in enumerate(workers):
        p = info.profile
        use = per_call[w]
        base = p.iter_base_s * float(iters_per_s[w]) / mult[w]
        gpu = float(x[w] @ use["gpu_s"]) / mult[w]
        tok = min(p.token_s * float(x[w] @ use["tokens"]) / mult[w], gpu)
        busy.append(base + gpu)
        split.append((base, tok, gpu - tok))
        seqs.append(float(x[w] @ use["iters"]) / float(iters_per_s[w]) if iters_per_s[w] > 0 else 0.0)
    return busy, split, seqs


def solve_fluid_bound(
    workers: Sequence[WorkerInfo],
    queries: Sequence[Sequence[CallSpec]],
    *,
    max_groups: int = MAX_GROUPS,
    bucket_ratio: float = 1.02,
    prefix_caching: bool = False,
    engines: Sequence[int] | None = None,
) -> FluidBound:
    """Solve the fluid-bound program for the mix ``queries`` (one call list per workflow, in issue order); an
    empty mix has no bound (``rate_qps`` infinite); ``RuntimeError`` if the solver fails.

    ``prefix_caching``: every call is credited with the most any cache could serve it (``best_case_cached``),
    so the program stays a bound. ``engines``: how many identical engines each entry of ``workers`` stands
    for (one engine with ``n`` seconds of GPU time per second: exact, as an even split of its solution is
    feasible for each); ``calls_per_s`` is then per entry, ``gpu_busy`` per engine."""
    mult = _engines(workers, engines, bucket_ratio)
    mix = _mix(workers, queries, prefix_caching)
    n_w = len(workers)
    if not mix:
        return FluidBound(math.inf, (0.0,) * n_w, (0.0,) * n_w, 0, ((0.0, 0.0, 0.0),) * n_w, (0.0,) * n_w)
    n_in, n_out, n_cached, counts, group = _groups(mix, max_groups, bucket_ratio)
    n_g = int(group.max()) + 1
    per_wf = np.zeros(n_g)
    np.add.at(per_wf, group, counts / len(queries))
    a_ub, per_call = _capacity_rows(workers, (n_in, n_out, n_cached), group, n_g)
    n_x = n_w * n_g
    n_var = 1 + n_x + n_w
    b_ub = np.array([float(mult[w]) if r == 0 else 0.0 for w in range(n_w) for r in range(_ROWS)])
    # Every call type is served: sum_w x[w, g] - per_wf[g] * lambda = 0.
    g_idx = np.arange(n_g)
    eq_rows = np.concatenate([np.repeat(g_idx, n_w), g_idx])
    eq_cols = np.concatenate([(1 + np.arange(n_w)[None, :] * n_g + g_idx[:, None]).reshape(-1), np.zeros(n_g, int)])
    eq_vals = np.concatenate([np.ones(n_x), -per_wf])
    a_eq = coo_matrix((eq_vals, (eq_rows, eq_cols)), shape=(n_g, n_var))
    c = np.zeros(n_var)
    c[0] = -1.0
    sol = linprog(c, A_ub=a_ub.tocsr(), b_ub=b_ub, A_eq=a_eq.tocsr(), b_eq=np.zeros(n_g), method="highs")
    if sol.status != 0:
        raise RuntimeError(f"fluid-bound program not solved: {sol.message}")
    x = sol.x[1 : 1 + n_x].reshape(n_w, n_g)
    busy, split, seqs = _solution(workers, mult, x, sol.x[1 + n_x :], per_call)
    return FluidBound(
        float(sol.x[0]), tuple(float(v) for v in x.sum(axis=1)), tuple(busy), n_g, tuple(split), tuple(seqs)
    )


def fluid_bound(
    workers: Sequence[WorkerInfo], queries: Sequence[Sequence[CallSpec]], *, prefix_caching: bool = False
) -> float:
    """The largest workflow rate (workflows/s) any scheduler could sustain on ``workers`` for the mix
    ``queries``: ``solve_fluid_bound(...).rate_qps``."""
    return solve_fluid_bound(workers, queries, prefix_caching=prefix_caching).rate_qps


def burst_goodput_bound(
    arrivals: Sequence[float],
    deadline_s: float,
    settings: Sequence[tuple[float, float]],
    *,
    windows: int = 60,
) -> float:
    """The most correct answers within their deadline any scheduler could give the workflows arriving at
    ``arrivals`` (each due ``deadline_s`` after it), from the fluid bound of each knob setting: ``settings`` holds
    (accuracy, fluid-bound rate in workflows/s) per setting. A linear program over ``windows`` windows of arrival
    time: each window's arrivals are refused or served at a mix of settings, and the workflows of any run of
    consecutive windows, arriving between its first and last arrival and due by the last one's deadline, fit in
    that span's cluster time (a workflow at a setting takes 1 / its rate of it). Every schedule meets these
    constraints, so the program bounds them all (with each workflow at its mix's mean work)."""
    usable = [(a, r) for a, r in settings if r > 0 and math.isfinite(r) and a > 0]
    if not arrivals or not usable:
        return 0.0
    t = np.sort(np.asarray(arrivals, dtype=np.float64))
    width = max(float(t[-1] - t[0]) / windows, 1e-9)
    slot = np.minimum(((t - t[0]) / width).astype(np.int64), windows - 1)
    n = np.bincount(slot, minlength=windows).astype(np.float64)
    keep = np.flatnonzero(n)  # windows with arrivals
    first = np.array([t[slot == w][0] for w in keep])
    last = np.array([t[slot == w][-1] for w in keep])
    m, k = len(keep), len(usable)
    acc = np.array([a for a, _ in usable])
    work = np.array([1.0 / r for _, r in usable])
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    b: list[float] = []
    r = 0
    for u in range(m):  # arrivals per window: sum_k y[w, k] <= n[w]
        rows.append(np.full(k, r))
        cols.append(u * k + np.arange(k))
        vals.append(np.ones(k))
        b.append(float(n[keep[u]]))
        r += 1
    for u in range(m):  # cluster time of windows u..v
        for v in range(u, m):
            span = (v - u + 1) * k
            rows.append(np.full(span, r))
            cols.append(u * k + np.arange(span))
            vals.append(np.tile(work, v - u + 1))
            b.append(float(last[v] + deadline_s - first[u]))
            r += 1
    a_ub = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, m * k))
    sol = linprog(-np.tile(acc, m), A_ub=a_ub.tocsr(), b_ub=np.array(b), method="highs")
    if sol.status != 0:
        raise RuntimeError(f"burst goodput-bound program not solved: {sol.message}")
    return float(-sol.fun)

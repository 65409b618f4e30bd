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
from scipy.sparse import coo_matrix, vstack

from gateway.core.prefix import best_case_cached
from gateway.core.profile import PerfProfile
from gateway.core.transfer import Link
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec

MAX_GROUPS = 2000
"""Distinct call types solved exactly; more are merged into geometric buckets."""

_ROWS = 4  # constraints per worker: GPU time, slots, batched tokens, KV


@dataclass(frozen=True)
class FluidBound:
    """The solved program: the largest sustainable workflow rate (workflows/s), and per worker at it: calls/s
    served (whole, or split calls' decode legs), fraction of time busy (1.0: the worker limits it), that busy time
    split per engine into per-iteration base, tokens and the rest (context, prefill attention, per-call host work),
    and calls in the batch per iteration; ``groups``: call types (or buckets) in the program."""

    rate_qps: float
    calls_per_s: tuple[float, ...]
    gpu_busy: tuple[float, ...]
    groups: int
    time_split: tuple[tuple[float, float, float], ...] = ()
    seqs_per_iteration: tuple[float, ...] = ()
    split_share: float = 0.0
    """With ``split``: the share of the calls the solution runs split (one solution of many)."""


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


def split_resources(
    profile: PerfProfile, n_in: np.ndarray, n_out: np.ndarray, n_cached: np.ndarray | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``call_resources`` of a split call's two legs: the prefill (its prompt and first token) and the decode (the
    other ``n_out - 1`` tokens, the prompt as context). Their GPU time, iterations and batched tokens add up to the
    whole call's; each holds the whole call's KV only while it runs (the transfer's holding left out: a
    relaxation)."""
    whole = call_resources(profile, n_in, n_out, n_cached)
    pre = call_resources(profile, n_in, np.ones_like(n_out), n_cached)
    kv = np.minimum(np.maximum(n_in, 1) + np.maximum(n_out, 1), float(profile.kv_capacity_tokens))
    dec = {k: np.maximum(whole[k] - pre[k], 0.0) for k in ("gpu_s", "iters", "tokens")}
    dec["kv_iters"] = kv * dec["iters"]
    return pre, dec


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
    workers: Sequence[WorkerInfo],
    types: tuple[np.ndarray, np.ndarray, np.ndarray],
    group: np.ndarray,
    n_g: int,
    *,
    split: bool = False,
) -> tuple[coo_matrix, list[dict[str, np.ndarray]], list[list[dict[str, np.ndarray]]]]:
    """The ``_ROWS`` inequality rows of every worker (GPU time, slots, batched tokens, KV) over the variables
    ``[lambda, x[w, g] (row-major), I[w]]`` and, with ``split``, ``p[w, g]`` and ``d[w, g]`` (split calls' prefill
    and decode legs) after them; per worker each group's least use of each resource, whole and per leg."""
    n_w = len(workers)
    n_x = n_w * n_g
    n_var = 1 + n_x + n_w + (2 * n_x if split else 0)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    g_idx = np.arange(n_g)
    per_call: list[dict[str, np.ndarray]] = []
    per_leg: list[list[dict[str, np.ndarray]]] = []
    for w, info in enumerate(workers):
        p = info.profile
        uses = [(call_resources(p, *types), 1 + w * n_g)]
        if split:
            pre, dec = split_resources(p, *types)
            uses += [(pre, 1 + n_x + n_w + w * n_g), (dec, 1 + 2 * n_x + n_w + w * n_g)]
        i_col = np.array([1 + n_x + w])
        limits = (
            ("gpu_s", 1.0, p.iter_base_s),
            ("iters", float(p.max_num_seqs), -1.0),
            ("tokens", float(max(p.max_batched_tokens, p.max_num_seqs)), -1.0),
            ("kv_iters", float(p.kv_capacity_tokens), -1.0),
        )
        least_of: list[dict[str, np.ndarray]] = [{} for _ in uses]
        for r, (key, scale, i_coef) in enumerate(limits):
            row = _ROWS * w + r
            for u, (res, first_col) in enumerate(uses):
                # A bucket uses the least any of its members uses (a relaxation: still a bound).
                least = np.full(n_g, np.inf)
                np.minimum.at(least, group, res[key])
                least_of[u][key] = least
                rows.append(np.full(n_g, row))
                cols.append(first_col + g_idx)
                vals.append(least / scale if r else least)
            rows.append(np.array([row]))
            cols.append(i_col)
            vals.append(np.array([i_coef]))
        per_call.append(least_of[0])
        per_leg.append(least_of[1:])
    shape = (_ROWS * n_w, n_var)
    matrix = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape)
    return matrix, per_call, per_leg


def _solution(
    workers: Sequence[WorkerInfo],
    mult: list[int],
    flows: list[tuple[np.ndarray, list[dict[str, np.ndarray]]]],
    iters_per_s: np.ndarray,
) -> tuple[list[float], list[tuple[float, float, float]], list[float]]:
    """Per worker at the solution: the busy fraction per engine, its split (base, tokens, the rest) and the calls
    per iteration; ``flows``: each kind of flow (whole calls, prefill legs, decode legs) per worker and group, with
    each worker's use per group."""
    busy, split, seqs = [], [], []
    for w, info in enumerate(workers):
        p = info.profile
        base = p.iter_base_s * float(iters_per_s[w]) / mult[w]
        gpu = sum(float(x[w] @ use[w]["gpu_s"]) for x, use in flows) / mult[w]
        tok = min(p.token_s * sum(float(x[w] @ use[w]["tokens"]) for x, use in flows) / mult[w], gpu)
        iters = sum(float(x[w] @ use[w]["iters"]) for x, use in flows)
        busy.append(base + gpu)
        split.append((base, tok, gpu - tok))
        seqs.append(iters / float(iters_per_s[w]) if iters_per_s[w] > 0 else 0.0)
    return busy, split, seqs


def solve_fluid_bound(
    workers: Sequence[WorkerInfo],
    queries: Sequence[Sequence[CallSpec]],
    *,
    max_groups: int = MAX_GROUPS,
    bucket_ratio: float = 1.02,
    prefix_caching: bool = False,
    engines: Sequence[int] | None = None,
    split: bool = False,
    links: Sequence[Sequence[Link | None]] | None = None,
) -> FluidBound:
    """Solve the fluid-bound program for the mix ``queries`` (one call list per workflow, in issue order); an
    empty mix has no bound (``rate_qps`` infinite); ``RuntimeError`` if the solver fails.

    ``prefix_caching``: every call is credited with the most any cache could serve it (``best_case_cached``),
    so the program stays a bound. ``engines``: how many identical engines each entry of ``workers`` stands
    for (one engine with ``n`` seconds of GPU time per second: exact, as an even split of its solution is
    feasible for each); ``calls_per_s`` is then per entry, ``gpu_busy`` per engine.

    ``split``: a call may also run split (prefill/decode disaggregation): its prefill on one worker, its decode on
    another, within the workers' roles (a ``prefill`` worker runs only prefills, a ``decode`` one no prefill leg,
    a ``colocated`` one anything) and, with ``links`` (``[a][b]``: the link from worker ``a`` to ``b``), the KV
    each worker sends or receives per second within the sum of its links' bandwidth (the uncached prompt's KV at
    the sender's bytes per token). Without ``split`` every call runs whole wherever (roles ignored)."""
    mult = _engines(workers, engines, bucket_ratio)
    mix = _mix(workers, queries, prefix_caching)
    n_w = len(workers)
    if not mix:
        return FluidBound(math.inf, (0.0,) * n_w, (0.0,) * n_w, 0, ((0.0, 0.0, 0.0),) * n_w, (0.0,) * n_w)
    if links is not None and (len(links) != n_w or any(len(row) != n_w for row in links)):
        raise ValueError(f"links must be {n_w} x {n_w} (one per pair of workers)")
    n_in, n_out, n_cached, counts, group = _groups(mix, max_groups, bucket_ratio)
    n_g = int(group.max()) + 1
    per_wf = np.zeros(n_g)
    np.add.at(per_wf, group, counts / len(queries))
    a_ub, per_call, per_leg = _capacity_rows(workers, (n_in, n_out, n_cached), group, n_g, split=split)
    n_x = n_w * n_g
    n_var = a_ub.shape[1]
    b_ub = np.array([float(mult[w]) if r == 0 else 0.0 for w in range(n_w) for r in range(_ROWS)])
    a_eq, bounds = _served_rows(workers, per_wf, n_var, split=split, sized=links is not None)
    if split and links is not None:
        a_ub, b_ub = _link_rows(workers, mult, links, (n_in, n_cached), group, n_g, a_ub, b_ub)
    n_eq = a_eq.shape[0]
    c = np.zeros(n_var)
    c[0] = -1.0
    sol = linprog(
        c, A_ub=a_ub.tocsr(), b_ub=b_ub, A_eq=a_eq.tocsr(), b_eq=np.zeros(n_eq), bounds=bounds, method="highs"
    )
    if sol.status != 0:
        raise RuntimeError(f"fluid-bound program not solved: {sol.message}")
    x = sol.x[1 : 1 + n_x].reshape(n_w, n_g)
    flows = [(x, per_call)]
    served = x.sum(axis=1)
    split_share = 0.0
    if split:
        pre = sol.x[1 + n_x + n_w : 1 + 2 * n_x + n_w].reshape(n_w, n_g)
        dec = sol.x[1 + 2 * n_x + n_w :].reshape(n_w, n_g)
        flows += [(pre, [legs[0] for legs in per_leg]), (dec, [legs[1] for legs in per_leg])]
        served = served + dec.sum(axis=1)
        total = float(x.sum() + pre.sum())
        split_share = float(pre.sum()) / total if total > 0 else 0.0
    busy, parts, seqs = _solution(workers, mult, flows, sol.x[1 + n_x : 1 + n_x + n_w])
    return FluidBound(
        float(sol.x[0]), tuple(float(v) for v in served), tuple(busy), n_g, tuple(parts), tuple(seqs), split_share
    )


def _served_rows(
    workers: Sequence[WorkerInfo], per_wf: np.ndarray, n_var: int, *, split: bool, sized: bool
) -> tuple[coo_matrix, list[tuple[float, float | None]]]:
    """The equality rows (every call type served at ``per_wf`` x lambda, whole or as a prefill leg; with ``split``
    every prefill leg with its decode leg) and each variable's bounds (the workers' roles; ``sized``: a worker
    whose KV size is unknown runs no leg)."""
    n_w, n_g = len(workers), len(per_wf)
    n_x = n_w * n_g
    g_idx = np.arange(n_g)
    x_cols = (1 + np.arange(n_w)[None, :] * n_g + g_idx[:, None]).reshape(-1)  # by group, then worker
    # Every call type is served: sum_w x[w, g] (+ p[w, g]) - per_wf[g] * lambda = 0.
    eq_rows = [np.repeat(g_idx, n_w), g_idx]
    eq_cols = [x_cols, np.zeros(n_g, int)]
    eq_vals = [np.ones(n_x), -per_wf]
    n_eq = n_g
    bounds: list[tuple[float, float | None]] = [(0.0, None)] * n_var
    if split:
        p_cols, d_cols = x_cols + n_x + n_w, x_cols + 2 * n_x + n_w
        eq_rows += [np.repeat(g_idx, n_w), np.repeat(g_idx + n_g, n_w), np.repeat(g_idx + n_g, n_w)]
        eq_cols += [p_cols, p_cols, d_cols]
        eq_vals += [np.ones(n_x), np.ones(n_x), -np.ones(n_x)]  # and every prefill leg has its decode leg
        n_eq += n_g
        for w, info in enumerate(workers):
            off = w * n_g
            never = info.kv_bytes_per_token <= 0 and sized
            for g in range(n_g):
                if info.role == "prefill":
                    bounds[1 + off + g] = bounds[1 + 2 * n_x + n_w + off + g] = (0.0, 0.0)
                if info.role == "decode" or never:
                    bounds[1 + n_x + n_w + off + g] = (0.0, 0.0)
                if never:
                    bounds[1 + 2 * n_x + n_w + off + g] = (0.0, 0.0)
    a_eq = coo_matrix(
        (np.concatenate(eq_vals), (np.concatenate(eq_rows), np.concatenate(eq_cols))), shape=(n_eq, n_var)
    )
    return a_eq, bounds


def _link_rows(
    workers: Sequence[WorkerInfo],
    mult: list[int],
    links: Sequence[Sequence[Link | None]],
    types: tuple[np.ndarray, np.ndarray],
    group: np.ndarray,
    n_g: int,
    a_ub: coo_matrix,
    b_ub: np.ndarray,
) -> tuple[coo_matrix, np.ndarray]:
    """``a_ub``/``b_ub`` with two rows per worker: the KV bytes per second its prefill legs send, and its decode
    legs receive, within the sum of its links' bandwidth out and in (a relaxation of the links between pairs)."""
    n_w = len(workers)
    n_x = n_w * n_g
    n_in, n_cached = types
    uncached = np.maximum(np.maximum(n_in, 1) - n_cached, 0).astype(np.float64)
    least = np.full(n_g, np.inf)
    np.minimum.at(least, group, uncached)
    rows, cols, vals, bounds = [], [], [], []
    g_idx = np.arange(n_g)
    for w, info in enumerate(workers):
        out_bps = sum(link.gbps for link in links[w] if link is not None) * 1e9 / 8.0
        in_bps = sum(link.gbps for link in (links[a][w] for a in range(n_w)) if link is not None) * 1e9 / 8.0
        per_byte = float(info.kv_bytes_per_token)
        for k, (first, cap) in enumerate(((1 + n_x + n_w, out_bps), (1 + 2 * n_x + n_w, in_bps))):
            rows.append(np.full(n_g, 2 * w + k))
            cols.append(first + w * n_g + g_idx)
            vals.append(least * per_byte)
            bounds.append(cap * mult[w])
    extra = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(2 * n_w, a_ub.shape[1])
    )
    return vstack([a_ub, extra]).tocoo(), np.concatenate([b_ub, np.array(bounds)])


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

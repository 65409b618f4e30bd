"""The per-call step cost (``PerfProfile.seq_s``): host work per decoding call per iteration, charged alike by
the profile's closed forms, the gateway's estimates, the fluid bound, the refit's rows and the config file
(measured 0.14-0.27 ms per decoding request per step on vLLM's CPU server; 0 in every published GPU profile)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from gateway.bench.bound import call_resources, solve_fluid_bound
from gateway.config import load_cluster
from gateway.config.gpus import ProfileSpec
from gateway.core.estimates import Estimator
from gateway.core.latency import LatencyModel
from gateway.core.profile import CONSTANTS, PerfProfile, profile_from, time_scaled
from gateway.core.samples import CallSample
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec
from gateway.profiling.refit import constants_of, refit_bounds, sample_rows

CPU = PerfProfile("cpu", "tiny", 0.003, 3e-5, 5e-8, 0.01, 60_000, 8, 2048, attn_s=1e-7, block_tokens=128, seq_s=2e-4)
NO_SEQ = dataclasses.replace(CPU, seq_s=0.0)


def test_the_profile_carries_it_through_every_path_a_profile_travels() -> None:
    assert CONSTANTS[-2] == "seq_s"
    assert pickle.loads(pickle.dumps(CPU)) == CPU
    assert profile_from("cpu", "tiny", CPU) == CPU
    assert time_scaled(CPU, 2.0).seq_s == pytest.approx(4e-4)
    spec = ProfileSpec(
        tp=1, iter_base_s=0.003, token_s=3e-5, ctx_s=5e-8, request_overhead_s=0.01, kv_capacity_tokens=60_000
    )
    assert spec.seq_s == 0.0 and profile_from("X", "m", spec).seq_s == 0.0
    assert profile_from("X", "m", spec.model_copy(update={"seq_s": 2e-4})).seq_s == 2e-4
    with pytest.raises(ValueError, match="seq_s"):
        ProfileSpec.model_validate({**spec.model_dump(), "seq_s": -1e-4})


def test_the_closed_forms_charge_it_per_decoding_call_per_step() -> None:
    # Once per decode step after the first token; never for a prompt.
    assert CPU.engine_latency(1500, 1) == NO_SEQ.engine_latency(1500, 1)
    assert CPU.engine_latency(100, 65) - NO_SEQ.engine_latency(100, 65) == pytest.approx(64 * CPU.seq_s)
    # A decode step of n calls: n times.
    assert CPU.iter_time(8, 0.0, decoders=8) - NO_SEQ.iter_time(8, 0.0, decoders=8) == pytest.approx(8 * CPU.seq_s)
    # It is a cost per call in the batch, so it lowers the batch a latency-bound engine runs.
    big, big0 = (dataclasses.replace(p, max_num_seqs=256) for p in (CPU, NO_SEQ))
    assert big.derived_capacity(call_tokens=1000) == 12 < big0.derived_capacity(call_tokens=1000) == 39


def test_the_gateways_estimates_charge_it_in_every_decode_step() -> None:
    est = Estimator([WorkerInfo("a", CPU, 8), WorkerInfo("b", NO_SEQ, 8)])
    # Alone: the lone latency, seq_s included.
    assert est.base_latency(0, 300, 41) == pytest.approx(CPU.single_latency(300, 41))
    # In the batch it would join, through the dispatch hot path (scan) and the method (t_comp) alike.
    est.loads[0].inflight = est.loads[1].inflight = 3
    got = est.t_comp(0, "k", 300, 41, 0.0) - est.t_comp(1, "k", 300, 41, 0.0)
    assert got == pytest.approx(40 * 4 * CPU.seq_s)
    est.scan([0, 1], "k", 300, 41, 0.0)
    assert est.rows[0].t_comp == pytest.approx(est.t_comp(0, "k", 300, 41, 0.0), rel=1e-12)
    # Its share of a full batch's engine time (admission's fluid forecast).
    assert est.gpu_s(0, 300, 41) - est.gpu_s(1, 300, 41) == pytest.approx(40 * CPU.seq_s)


def test_the_fluid_bound_counts_it_and_stays_below_without_it() -> None:
    i, o = np.array([300.0, 40.0]), np.array([41.0, 1.0])
    diff = call_resources(CPU, i, o)["gpu_s"] - call_resources(NO_SEQ, i, o)["gpu_s"]
    assert diff == pytest.approx([40 * CPU.seq_s, 0.0])
    cluster = load_cluster("paper-4gpu")
    queries = [[CallSpec("gen", 500, 60)] * 4 for _ in range(20)]
    with_seq = [WorkerInfo(w.name, dataclasses.replace(w.profile, seq_s=w.profile.iter_base_s), 8) for w in cluster]
    without = [WorkerInfo(w.name, w.profile, 8) for w in cluster]
    assert solve_fluid_bound(with_seq, queries).rate_qps < solve_fluid_bound(without, queries).rate_qps


def test_the_refit_holds_it_fixed_and_its_rows_carry_it() -> None:
    s = CallSample(
        prefill_tokens=200, output_tokens=31, batch_n=4, batch_ctx=900.0, wait_tokens=0.0, observed_s=1.0, at=0.0
    )
    a, _ = sample_rows([s], LatencyModel(CPU))
    assert a.shape == (1, 7) and a[0, 5] == 30 * 4  # decoding calls summed over its decode steps
    assert constants_of(CPU)[5] == CPU.seq_s
    lower, upper = refit_bounds(CPU, CPU, 1.5, 8.0)
    assert lower[5] == upper[5] == CPU.seq_s

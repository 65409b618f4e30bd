"""The GPU catalogue: typed loading, lookups and the physical sanity of every profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import DEFAULT_GPU_CATALOG, GpuCatalog, load_gpu_catalog
from gateway.config.workflows import STANDARD_WORKFLOW
from gateway.core.profile import PerfProfile
from gateway.errors import ConfigError, UnknownNameError

GPUS = ["A100", "H100", "H200", "A800", "A6000", "L40S", "L40", "A40", "L4"]
MODELS = ["llama-3.1-70b", "llama-3.1-8b"]


@pytest.fixture(scope="module")
def catalog() -> GpuCatalog:
    return load_gpu_catalog()


def candidate_s(p: PerfProfile) -> float:
    return p.single_latency(11748, 678)


def workflow_s(p: PerfProfile) -> float:
    return sum(p.single_latency(c.input_tokens, c.output_tokens) for c in STANDARD_WORKFLOW)


def test_catalog_lists_every_gpu_and_model(catalog: GpuCatalog) -> None:
    assert set(catalog.gpus) == set(GPUS)
    assert set(catalog.models) == set(MODELS)


def test_model_kv_bytes_per_token_follow_the_architecture(catalog: GpuCatalog) -> None:
    assert catalog.models["llama-3.1-70b"].kv_bytes_per_token == 80 * 8 * 128 * 2 * 2
    assert catalog.models["llama-3.1-8b"].kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    assert catalog.models["llama-3.1-70b"].weight_bytes == pytest.approx(141.2e9)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpu", GPUS)
def test_every_profile_is_physically_sane(catalog: GpuCatalog, gpu: str, model: str) -> None:
    p = catalog.profile(gpu, model)
    assert (p.gpu, p.model) == (gpu, model)
    assert p.iter_base_s > 0 and p.token_s > 0 and p.ctx_s > 0 and p.request_overhead_s > 0
    assert p.max_num_seqs >= 1 and p.max_batched_tokens >= 1
    # At least one 16k-token request (prompt plus output) fits in the KV cache.
    assert p.kv_capacity_tokens >= 16384
    # A decode step costs more than one token's compute: lone decoding is memory-bound.
    assert p.iter_base_s > p.token_s


def test_profile_kv_capacity_follows_memory_left_after_weights(catalog: GpuCatalog) -> None:
    # 4 x 48 GB x 0.9 - 141.2 GB = 31.6 GB of KV cache at 327,680 B per token.
    assert catalog.profile_spec("A6000", "llama-3.1-70b").kv_capacity_tokens == 96435
    assert catalog.profile_spec("L4", "llama-3.1-70b").tp == 8


@pytest.mark.parametrize("model", MODELS)
def test_h100_is_faster_than_a40_on_candidate_generation(catalog: GpuCatalog, model: str) -> None:
    assert candidate_s(catalog.profile("H100", model)) < candidate_s(catalog.profile("A40", model))


@pytest.mark.parametrize("model", MODELS)
def test_h200_is_faster_than_h100(catalog: GpuCatalog, model: str) -> None:
    h200, h100 = catalog.profile("H200", model), catalog.profile("H100", model)
    assert candidate_s(h200) < candidate_s(h100)
    assert workflow_s(h200) < workflow_s(h100)


def test_l40s_is_faster_than_l40_on_prefill(catalog: GpuCatalog) -> None:
    l40s, l40 = catalog.profile("L40S", "llama-3.1-70b"), catalog.profile("L40", "llama-3.1-70b")
    assert l40s.token_s < l40.token_s
    assert candidate_s(l40s) < candidate_s(l40)


@pytest.mark.parametrize("gpu", GPUS)
def test_8b_is_faster_than_70b_on_the_same_gpu(catalog: GpuCatalog, gpu: str) -> None:
    small, big = catalog.profile(gpu, "llama-3.1-8b"), catalog.profile(gpu, "llama-3.1-70b")
    assert candidate_s(small) < candidate_s(big)
    assert workflow_s(small) < workflow_s(big)


@pytest.mark.parametrize(
    ("gpu", "model", "what"),
    [
        ("A1000", "llama-3.1-70b", "GPU"),
        ("A100", "llama-9b", "model"),
    ],
)
def test_profile_of_unknown_name_raises_unknown_name_error(
    catalog: GpuCatalog, gpu: str, model: str, what: str
) -> None:
    with pytest.raises(UnknownNameError) as info:
        catalog.profile(gpu, model)
    assert info.value.what == what


def test_profile_of_a_pair_without_constants_raises_unknown_name_error(catalog: GpuCatalog) -> None:
    data = catalog.model_dump()
    del data["profiles"]["llama-3.1-8b"]["L4"]
    partial = GpuCatalog.model_validate(data)
    with pytest.raises(UnknownNameError, match=r"'L4/llama-3\.1-8b'"):
        partial.profile("L4", "llama-3.1-8b")


A100_70B = ("profiles", "llama-3.1-70b", "A100")


def _write_catalog(tmp_path: Path, keys: tuple[str, ...], value: object) -> Path:
    data = yaml.safe_load(DEFAULT_GPU_CATALOG.read_text(encoding="utf-8"))
    if value is A100_70B:
        value = data["profiles"]["llama-3.1-70b"]["A100"]
    *parents, last = keys
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("keys", "value", "field", "problem"),
    [
        (("gpus", "A100", "mem_bw_tbs"), -1.0, "gpus.A100.mem_bw_tbs", "greater than 0"),
        (("gpus", "A100", "colour"), "green", "gpus.A100.colour", "unknown key; allowed: description"),
        (
            ("profiles", "llama-3.1-70b", "B200"),
            A100_70B,
            "profiles.llama-3.1-70b.B200",
            "unknown GPU 'B200'",
        ),
        (("profiles", "llama-3.1-70b", "A100", "tp"), 0, "profiles.llama-3.1-70b.A100.tp", "greater than"),
        (("calibration", "reference_gpu"), "L4", "calibration.reference_gpu", "no published latency"),
        (("calibration", "decode_from", "L4"), "H200", "calibration.decode_from.L4", "no published latency"),
    ],
)
def test_invalid_catalog_raises_config_error_naming_file_and_field(
    tmp_path: Path, keys: tuple[str, ...], value: object, field: str, problem: str
) -> None:
    path = _write_catalog(tmp_path, keys, value)
    with pytest.raises(ConfigError) as info:
        load_gpu_catalog(path)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert problem in info.value.problem
    assert str(info.value).startswith(f"{path}: {field}: ")


def test_every_gpu_has_an_indicative_price_and_a_worker_costs_it_times_its_tp(catalog: GpuCatalog) -> None:
    for gpu in GPUS:
        price = catalog.gpus[gpu].usd_per_hour
        assert price is not None and 0.1 < price < 20.0, gpu  # per GPU-hour, not per 8-GPU instance
        for model in MODELS:
            tp = catalog.profile_spec(gpu, model).tp
            assert catalog.worker_usd_per_hour(gpu, model) == pytest.approx(price * tp)
    # A 70B worker is 4 GPUs (8 on the L4), an 8B worker one.
    l4_price = catalog.gpus["L4"].usd_per_hour
    assert l4_price is not None
    assert catalog.worker_usd_per_hour("L4", "llama-3.1-70b") == pytest.approx(8 * l4_price)
    assert catalog.worker_usd_per_hour("A100", "llama-3.1-8b") == pytest.approx(catalog.gpus["A100"].usd_per_hour)


def test_a_gpu_without_a_price_has_no_worker_price_and_a_price_must_be_positive(catalog: GpuCatalog) -> None:
    data = catalog.model_dump()
    data["gpus"]["A100"]["usd_per_hour"] = None
    assert GpuCatalog.model_validate(data).worker_usd_per_hour("A100", "llama-3.1-70b") is None
    data["gpus"]["A100"]["usd_per_hour"] = 0.0
    with pytest.raises(ValueError, match="usd_per_hour"):
        GpuCatalog.model_validate(data)

"""The GPU profiles reproduce the published single-request latencies they were calibrated on."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from gateway.config import DEFAULT_GPU_CATALOG, GpuCatalog, load_gpu_catalog
from gateway.config.workflows import STANDARD_WORKFLOW
from gateway.core.profile import PerfProfile
from gateway.sim.calibrate import fit, fit_profiles, main, render_profiles_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE_MD = REPO_ROOT.parent / "shared" / "data" / "hexgen-traces" / "SOURCE.md"
MODEL = "llama-3.1-70b"

# hexgen-traces SOURCE.md, Llama-3.1-70B, single request: (standard workflow s, generate_candidate s).
PUBLISHED: dict[str, tuple[float, float]] = {
    "A100": (37.5, 18.24),
    "H100": (17.3, 8.79),
    "A6000": (78.0, 34.27),
    "L40": (66.8, 32.62),
    "A40": (109.0, 40.35),
    "A800": (24.1, 10.27),
}


def workflow_s(p: PerfProfile) -> float:
    return sum(p.single_latency(c.input_tokens, c.output_tokens) for c in STANDARD_WORKFLOW)


def candidate_s(p: PerfProfile) -> float:
    return p.single_latency(11748, 678)


@pytest.fixture(scope="module")
def catalog() -> GpuCatalog:
    return load_gpu_catalog()


@pytest.mark.parametrize("gpu", sorted(PUBLISHED))
def test_profile_candidate_latency_within_10pct_of_published(catalog: GpuCatalog, gpu: str) -> None:
    predicted = candidate_s(catalog.profile(gpu, MODEL))
    assert predicted == pytest.approx(PUBLISHED[gpu][1], rel=0.10)


@pytest.mark.parametrize("gpu", sorted(PUBLISHED))
def test_profile_standard_workflow_latency_within_10pct_of_published(catalog: GpuCatalog, gpu: str) -> None:
    predicted = workflow_s(catalog.profile(gpu, MODEL))
    assert predicted == pytest.approx(PUBLISHED[gpu][0], rel=0.10)


def test_catalog_calibration_targets_equal_the_published_table(catalog: GpuCatalog) -> None:
    cal = catalog.calibration
    assert cal.model == MODEL
    got = {g: (t.workflow_s, t.candidate_s) for g, t in cal.published.items()}
    assert got == PUBLISHED


_FIGURE = r"([A-Z][A-Z0-9]+) (\d+(?:\.\d+)?) s"
_FIGURE_LIST = re.compile(rf"(?:{_FIGURE}(?:, |\.|$))+")


def _figures(segment: str) -> dict[str, float]:
    """The first 'GPU 12.3 s, GPU 4.5 s.' list in ``segment``."""
    found = _FIGURE_LIST.search(segment)
    assert found is not None, segment
    return {g: float(v) for g, v in re.findall(_FIGURE, found.group(0))}


def _parse_source_md(text: str) -> dict[str, tuple[float, float]]:
    flat = " ".join(text.split())
    after = flat.split("latency of a whole standard workflow", 1)[1]
    wf_text, cand_text = after.split("Candidate generation alone:", 1)
    workflow, candidate = _figures(wf_text), _figures(cand_text)
    assert workflow.keys() == candidate.keys()
    return {g: (workflow[g], candidate[g]) for g in workflow}


@pytest.mark.shared
def test_published_table_matches_shared_source_md() -> None:
    if not SOURCE_MD.is_file():
        pytest.skip(f"{SOURCE_MD} is absent")
    assert _parse_source_md(SOURCE_MD.read_text(encoding="utf-8")) == PUBLISHED


def test_fit_meets_published_targets_exactly_before_rounding(catalog: GpuCatalog) -> None:
    for p in fit(catalog):
        if p.model == MODEL and p.gpu in PUBLISHED:
            wf, cand = PUBLISHED[p.gpu]
            assert workflow_s(p.perf()) == pytest.approx(wf, rel=1e-9)
            assert candidate_s(p.perf()) == pytest.approx(cand, rel=1e-9)


def test_gpus_yaml_profiles_equal_the_fitter_output(catalog: GpuCatalog) -> None:
    expected = fit_profiles(catalog)
    assert set(catalog.profiles) == set(expected)
    for model, per_gpu in expected.items():
        assert set(catalog.profiles[model]) == set(per_gpu), model
        for gpu, want in per_gpu.items():
            have = catalog.profiles[model][gpu].model_dump()
            for key, value in want.items():
                if isinstance(value, float):
                    assert math.isclose(have[key], value, rel_tol=1e-9), f"{gpu}/{model}.{key}"
                else:
                    assert have[key] == value, f"{gpu}/{model}.{key}"


def test_fit_profiles_accepts_the_raw_yaml_mapping(catalog: GpuCatalog) -> None:
    data = yaml.safe_load(DEFAULT_GPU_CATALOG.read_text(encoding="utf-8"))
    assert fit_profiles(data) == fit_profiles(catalog)


def test_rendered_profiles_yaml_reads_back_as_the_fitted_values(catalog: GpuCatalog) -> None:
    text = render_profiles_yaml(fit(catalog))
    assert yaml.safe_load(text)["profiles"] == fit_profiles(catalog)


def test_fit_rejects_targets_that_need_a_negative_overhead(catalog: GpuCatalog) -> None:
    data = catalog.model_dump()
    # A candidate call alone taking longer than the whole workflow is impossible.
    data["calibration"]["published"]["A100"] = {"workflow_s": 10.0, "candidate_s": 18.0}
    with pytest.raises(ValueError, match=r"A100/llama-3\.1-70b"):
        fit(data)


def test_calibrate_cli_prints_profiles_and_a_latency_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert set(yaml.safe_load(out)["profiles"]) == {"llama-3.1-70b", "llama-3.1-8b"}
    assert re.search(r"^# A100/llama-3\.1-70b .* 18\.24 +18\.24 +37\.50 +37\.50$", out, re.M)


def test_calibrate_cli_check_passes_on_the_repo_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check"]) == 0


def test_calibrate_cli_write_replaces_only_the_generated_section(tmp_path: Path) -> None:
    text = DEFAULT_GPU_CATALOG.read_text(encoding="utf-8")
    path = tmp_path / "gpus.yaml"
    marker = "do not edit below this line ---\n"
    head = text[: text.index(marker) + len(marker)]
    path.write_text(head + "profiles: {}\n", encoding="utf-8")
    assert main(["--catalog", str(path), "--check"]) == 1
    assert main(["--catalog", str(path), "--write"]) == 0
    assert path.read_text(encoding="utf-8") == text

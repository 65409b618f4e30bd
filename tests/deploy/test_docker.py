"""The container build and the compose stack: Dockerfile, .dockerignore, docker-compose.yml, deploy/compose/.

No container engine is needed: the Dockerfile is checked as text and docker-compose.yml is parsed with
PyYAML (profiles applied as Compose applies them). When the ``docker compose`` plugin is installed, the
file is also validated and rendered by Compose itself, for the default profile and for ``--profile gpu``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.live.settings import load_gateway_config

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
WORKERS = ["worker-a100-0", "worker-a100-1", "worker-a6000-0", "worker-l40s-0"]
VLLM_WORKERS = ["vllm-a100-0", "vllm-a100-1", "vllm-a6000-0", "vllm-l40s-0"]


# ----------------------------------------------------------------------------------------- Dockerfile
def _stages() -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """(base, name, [(INSTRUCTION, args)]) per stage; continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[tuple[str, str | None, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, args = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            m = re.match(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert m, line
            stages.append((m.group(1), m.group(2), []))
        elif stages:
            stages[-1][2].append((instr, args.strip()))
    return stages


def _chain(stage_index: int) -> list[tuple[str, str]]:
    """Instructions of a stage including those inherited from the stages it is built FROM."""
    stages = _stages()
    base, _, instrs = stages[stage_index]
    by_name = {name: i for i, (_, name, _) in enumerate(stages) if name}
    if base in by_name:
        return _chain(by_name[base]) + instrs
    return instrs


def _final() -> list[tuple[str, str]]:
    return _chain(len(_stages()) - 1)


def test_dockerfile_is_multi_stage_on_slim_python() -> None:
    stages = _stages()
    assert len(stages) >= 2
    external = [base for base, _, _ in stages if base not in {n for _, n, _ in stages if n}]
    assert all(b in {"${PYTHON_IMAGE}", "python:3.11-slim"} for b in external), external
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE.read_text()
    assert stages[-1][1] == "gateway", "the default (last) target is the gateway"


def test_final_stage_runs_as_non_root_without_compilers() -> None:
    final = _final()
    users = [args for instr, args in final if instr == "USER"]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"USER should be a numeric non-root uid, got {users[-1]!r}"
    runs = " ".join(args for instr, args in final if instr == "RUN")
    for banned in ("gcc", "build-essential", "apt-get install", "apk add"):
        assert banned not in runs, f"{banned!r} in the final stage"
    env = " ".join(args for instr, args in final if instr == "ENV")
    assert "PIP_NO_CACHE_DIR=1" in env
    assert "HEXFLOW_CONFIG_DIR=/etc/hexflow" in env
    assert any(instr == "COPY" and "--from=" in args for instr, args in final), "installs from the builder"


def test_final_stage_entrypoint_command_healthcheck() -> None:
    final = _final()
    kinds = dict(final)  # the last of each instruction wins, as in Docker
    assert kinds["ENTRYPOINT"] == '["hexflow"]'
    assert kinds["WORKDIR"] == "/app"
    assert kinds["EXPOSE"] == "8080"
    assert kinds["CMD"] == '["serve", "--config", "/etc/hexflow/gateway.yaml", "--host", "0.0.0.0"]'
    assert "/healthz" in kinds["HEALTHCHECK"] and "urllib" in kinds["HEALTHCHECK"]
    labels = " ".join(args for instr, args in final if instr == "LABEL")
    assert "org.opencontainers.image.title" in labels


def test_worker_emulator_target() -> None:
    stages = _stages()
    idx = next(i for i, (_, name, _) in enumerate(stages) if name == "worker-emulator")
    kinds = dict(_chain(idx))
    assert kinds["ENTRYPOINT"] == '["hexflow"]'
    assert kinds["CMD"].startswith('["emulate"')
    assert "/health'" in kinds["HEALTHCHECK"]


def test_dockerignore_excludes_local_state() -> None:
    entries = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    for needed in (".venv", ".git", "out", ".cache", "models", "**/__pycache__", ".pytest_cache"):
        assert needed in entries, needed
    for kept in ("gateway", "workers", "config", "pyproject.toml", "README.md"):
        assert kept not in entries, f"{kept} is needed by the build"


# ------------------------------------------------------------------------------------ docker-compose
def _render_here(profiles: tuple[str, ...]) -> dict[str, Any]:
    """docker-compose.yml with YAML anchors resolved, x-* dropped and Compose's profile selection applied."""
    doc = yaml.safe_load(COMPOSE.read_text())
    services = {
        name: svc
        for name, svc in doc["services"].items()
        if not svc.get("profiles") or set(svc["profiles"]) & set(profiles)
    }
    return {**doc, "services": services}


def _compose_cmd() -> list[str] | None:
    if shutil.which("docker") is None:
        return None
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    return ["docker", "compose"] if probe.returncode == 0 else None


@pytest.fixture(params=[(), ("gpu",)], ids=["default", "gpu"])
def rendered(request: pytest.FixtureRequest) -> tuple[tuple[str, ...], dict[str, Any]]:
    profiles: tuple[str, ...] = request.param
    return profiles, _render_here(profiles)


@pytest.mark.parametrize("profiles", [(), ("gpu",)], ids=["default", "gpu"])
def test_docker_compose_config_validates(profiles: tuple[str, ...]) -> None:
    cmd = _compose_cmd()
    if cmd is None:
        pytest.skip("the docker compose plugin is not installed")
    args = [*cmd, "-f", str(COMPOSE)]
    for p in profiles:
        args += ["--profile", p]
    quiet = subprocess.run([*args, "config", "--quiet"], capture_output=True, text=True, check=False, cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr
    out = subprocess.run([*args, "config"], capture_output=True, text=True, check=True, cwd=ROOT)
    services = yaml.safe_load(out.stdout)["services"]
    assert set(services) == set(_render_here(profiles)["services"])
    gateway = services["gateway-gpu" if profiles else "gateway"]
    assert any(str(p.get("published")) == "8080" and p.get("target") == 8080 for p in gateway["ports"])


def test_every_service_has_a_healthcheck(rendered: tuple[tuple[str, ...], dict[str, Any]]) -> None:
    _, doc = rendered
    for name, svc in doc["services"].items():
        hc = svc.get("healthcheck")
        assert hc and hc.get("test") and not hc.get("disable"), f"{name} has no healthcheck"


def test_default_profile_gateway_and_emulated_workers() -> None:
    services = _render_here(())["services"]
    assert set(services) == {"gateway", *WORKERS, "prometheus", "grafana"}
    gw = services["gateway"]
    assert "8080:8080" in gw["ports"]
    assert {w: {"condition": "service_healthy"} for w in WORKERS} == gw["depends_on"]
    assert "./deploy/compose/gateway.yaml:/etc/hexflow/gateway.yaml:ro" in gw["volumes"]
    assert "./config/tenants.yaml:/etc/hexflow/tenants.yaml:ro" in gw["volumes"]
    assert gw["build"]["target"] == "gateway"
    for w in WORKERS:
        svc = services[w]
        assert svc["build"]["target"] == "worker-emulator"
        cmd = svc["command"]
        assert cmd[0] == "emulate"
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
        assert cmd[cmd.index("--port") + 1] == "8000"
        assert cmd[cmd.index("--time-scale") + 1] == "0.05"
        assert "/health'" in " ".join(svc["healthcheck"]["test"])
    assert [services[w]["command"][2] for w in WORKERS] == ["A100", "A100", "A6000", "L40S"]


def test_monitoring_mounts_the_deploy_files() -> None:
    services = _render_here(())["services"]
    prom = services["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prom
    assert "./deploy/prometheus/rules:/etc/prometheus/rules:ro" in prom
    graf = services["grafana"]["volumes"]
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in graf
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in graf


def test_gpu_profile_vllm_workers_reserve_nvidia_gpus() -> None:
    services = _render_here(("gpu",))["services"]
    seen: set[str] = set()
    for name in VLLM_WORKERS:
        svc = services[name]
        assert svc["image"].startswith("vllm/vllm-openai:")
        cmd = svc["command"]
        assert cmd[cmd.index("--scheduling-policy") + 1] == "priority"
        tp = int(cmd[cmd.index("--tensor-parallel-size") + 1])
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
        ids = set(dev["device_ids"])
        assert len(ids) == tp, f"{name}: {len(ids)} GPUs for tensor parallelism {tp}"
        assert not ids & seen, f"{name} shares GPUs with another worker"
        seen |= ids
    gw = services["gateway-gpu"]
    assert {w: {"condition": "service_healthy"} for w in VLLM_WORKERS} == gw["depends_on"]
    assert "./deploy/compose/gateway-gpu.yaml:/etc/hexflow/gateway.yaml:ro" in gw["volumes"]
    # Prometheus scrapes worker-*:8000 and gateway:8080 whichever cluster runs.
    aliases = {a for n in [*VLLM_WORKERS, "gateway-gpu"] for a in services[n]["networks"]["default"]["aliases"]}
    assert aliases == {*WORKERS, "gateway"}


# ----------------------------------------------------------------------------- deploy/compose configs
@pytest.mark.parametrize(
    ("name", "hosts", "time_scale"),
    [("gateway.yaml", WORKERS, 0.05), ("gateway-gpu.yaml", VLLM_WORKERS, 1.0)],
)
def test_compose_gateway_configs_load(name: str, hosts: list[str], time_scale: float, tmp_path: Path) -> None:
    src = ROOT / "deploy" / "compose" / name
    loaded = load_gateway_config(src)
    assert loaded.cfg.listen.host == "0.0.0.0" and loaded.cfg.listen.port == 8080
    assert loaded.cfg.time_scale == time_scale
    assert [w.url for w in loaded.resolved] == [f"http://{h}:8000" for h in hosts]
    assert loaded.tenants_path == Path("/etc/hexflow/tenants.yaml")  # mounted there by docker-compose.yml
    # As the container sees it: the file next to a tenants file, tenants_file pointing at that copy.
    raw = yaml.safe_load(src.read_text())
    raw["tenants_file"] = str(tmp_path / "tenants.yaml")
    shutil.copy(ROOT / "config" / "tenants.yaml", tmp_path / "tenants.yaml")
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(raw))
    assert load_gateway_config(tmp_path / "gateway.yaml").tenants_path.is_file()

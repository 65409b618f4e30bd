"""The container build and the compose stack: Dockerfile, .dockerignore, docker-compose.yml, deploy/compose/.

No container engine is needed: the Dockerfile is checked as text and docker-compose.yml is parsed with
PyYAML (profiles applied as Compose applies them). Compose v2 itself (``docker compose config``, which
needs no engine) also validates and renders the file, for the default profile, for ``--profile gpu`` and
for the services the gpu stack is started with, and the normalised JSON it prints is checked. Those tests
skip without Compose v2 unless ``HEXFLOW_REQUIRE_COMPOSE=1`` (set by .ci/run, which installs the plugin).
"""

from __future__ import annotations

import functools
import json
import os
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


@pytest.fixture(params=[(), ("gpu",)], ids=["default", "gpu"])
def rendered(request: pytest.FixtureRequest) -> tuple[tuple[str, ...], dict[str, Any]]:
    profiles: tuple[str, ...] = request.param
    return profiles, _render_here(profiles)


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


# ------------------------------------------------------------------- docker-compose, rendered by Compose v2
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DEFAULT_STACK = {"gateway", *WORKERS, "prometheus", "grafana"}
GPU_STACK = {"gateway-gpu", *VLLM_WORKERS, "prometheus", "grafana"}
# (profiles, services named on the command line, the services Compose renders for them). "gpu-up" is what the
# documented `docker compose --profile gpu up -d gateway-gpu prometheus grafana` starts: the named services and
# their dependencies, so neither the emulated workers nor the default gateway, whose host names the vLLM
# servers and gateway-gpu take as network aliases.
STACKS: dict[str, tuple[tuple[str, ...], tuple[str, ...], set[str]]] = {
    "default": ((), (), DEFAULT_STACK),
    "gpu": (("gpu",), (), DEFAULT_STACK | GPU_STACK),
    "gpu-up": (("gpu",), ("gateway-gpu", "prometheus", "grafana"), GPU_STACK),
}
# Bind mounts (path in the repo -> path in the container), all read-only.
CONFIG_MOUNTS = {
    "gateway": {
        "deploy/compose/gateway.yaml": "/etc/hexflow/gateway.yaml",
        "config/tenants.yaml": "/etc/hexflow/tenants.yaml",
    },
    "gateway-gpu": {
        "deploy/compose/gateway-gpu.yaml": "/etc/hexflow/gateway.yaml",
        "config/tenants.yaml": "/etc/hexflow/tenants.yaml",
    },
    "prometheus": {
        "deploy/prometheus/prometheus.yml": "/etc/prometheus/prometheus.yml",
        "deploy/prometheus/rules": "/etc/prometheus/rules",
    },
    "grafana": {
        "deploy/grafana/provisioning": "/etc/grafana/provisioning",
        "deploy/grafana/dashboards": "/var/lib/grafana/dashboards",
    },
    **{name: {"models": "/models"} for name in VLLM_WORKERS},  # ${MODEL_DIR:-./models}
}


def _is_compose_v2(cmd: tuple[str, ...]) -> bool:
    try:
        probe = subprocess.run([*cmd, "version", "--short"], capture_output=True, text=True, check=False, timeout=30)
    except OSError:
        return False
    m = re.match(r"v?(\d+)\.", probe.stdout.strip())
    return probe.returncode == 0 and m is not None and int(m.group(1)) >= 2


@functools.cache
def _compose_cmd() -> tuple[str, ...] | None:
    """``docker compose`` (the v2 CLI plugin), else a standalone Compose v2 ``docker-compose``; never Compose v1."""
    for cmd in (("docker", "compose"), ("docker-compose",)):
        if shutil.which(cmd[0]) and _is_compose_v2(cmd):
            return cmd
    return None


@functools.cache
def _compose_config(profiles: tuple[str, ...], services: tuple[str, ...] = ()) -> dict[str, Any]:
    """``docker compose config --format json``: the file as Compose validates, interpolates and normalises it."""
    cmd = _compose_cmd()
    if cmd is None:
        if os.environ.get("HEXFLOW_REQUIRE_COMPOSE") == "1":
            pytest.fail("Compose v2 is not installed (`docker compose version` fails) and HEXFLOW_REQUIRE_COMPOSE=1")
        pytest.skip("Compose v2 is not installed (`docker compose version` fails; .ci/run installs the plugin)")
    args = [*cmd, "--project-directory", str(ROOT), "-f", str(COMPOSE), "-p", "hexgen-flow", "--env-file", os.devnull]
    for p in profiles:
        args += ["--profile", p]
    # Nothing of the caller's environment but what Compose needs to run: the file's own defaults apply
    # (MODEL_DIR, GRAFANA_ADMIN_*), and COMPOSE_PROFILES or COMPOSE_FILE set in a shell change nothing.
    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "DOCKER_CONFIG", "TMPDIR"}}
    proc = subprocess.run(
        [*args, "config", "--format", "json", *services],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warn" not in proc.stderr.lower(), proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _services(stack: str) -> dict[str, dict[str, Any]]:
    profiles, named, _ = STACKS[stack]
    services: dict[str, dict[str, Any]] = _compose_config(profiles, named)["services"]
    return services


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_v2_renders_the_profiles(stack: str) -> None:
    profiles, named, expected = STACKS[stack]
    services = _services(stack)
    assert set(services) == expected
    if not named:  # the PyYAML rendering the other tests use selects the same services
        assert set(services) == set(_render_here(profiles)["services"])
    for name, svc in services.items():
        assert svc.get("profiles", []) == (["gpu"] if name in GPU_STACK - DEFAULT_STACK else []), name


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_v2_every_service_has_a_healthcheck_and_waits_for_healthy(stack: str) -> None:
    for name, svc in _services(stack).items():
        hc = svc.get("healthcheck") or {}
        assert hc.get("test") and not hc.get("disable"), f"{name} has no healthcheck"
        assert hc["test"][0] in {"CMD", "CMD-SHELL"}, f"{name}: {hc['test']}"
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert spec["condition"] == "service_healthy", f"{name} starts before {dep} is healthy"


@pytest.mark.parametrize(
    ("stack", "gateway", "workers"),
    [("default", "gateway", WORKERS), ("gpu-up", "gateway-gpu", VLLM_WORKERS)],
    ids=["default", "gpu-up"],
)
def test_compose_v2_gateway_and_workers(stack: str, gateway: str, workers: list[str]) -> None:
    services = _services(stack)
    gw = services[gateway]
    assert gw["build"]["target"] == "gateway"
    assert gw["command"] == ["serve", "--config", "/etc/hexflow/gateway.yaml", "--host", "0.0.0.0", "--port", "8080"]
    assert [(p["target"], str(p["published"])) for p in gw["ports"]] == [(8080, "8080")]
    assert {dep: spec["condition"] for dep, spec in gw["depends_on"].items()} == dict.fromkeys(
        workers, "service_healthy"
    )
    for w in workers:
        cmd = services[w]["command"]
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
        assert cmd[cmd.index("--port") + 1] == "8000"
        assert services[w]["expose"] == ["8000"]
    if stack == "default":
        assert [services[w]["build"]["target"] for w in WORKERS] == ["worker-emulator"] * len(WORKERS)
        assert [services[w]["command"][2] for w in WORKERS] == ["A100", "A100", "A6000", "L40S"]
        for w in WORKERS:
            cmd = services[w]["command"]
            assert cmd[0] == "emulate" and cmd[cmd.index("--time-scale") + 1] == "0.05"


@pytest.mark.parametrize(
    ("stack", "gateway", "workers"),
    [("default", "gateway", WORKERS), ("gpu-up", "gateway-gpu", VLLM_WORKERS)],
    ids=["default", "gpu-up"],
)
def test_compose_v2_prometheus_scrapes_every_worker_and_the_gateway(
    stack: str, gateway: str, workers: list[str]
) -> None:
    services = _services(stack)
    hosts: dict[str, list[str]] = {}  # host name on the stack's network -> the services answering to it
    for name, svc in services.items():
        networks = svc.get("networks") or {}
        assert set(networks) == {"default"}, f"{name} is not on the network Prometheus is on"
        for host in [name, *((networks["default"] or {}).get("aliases") or [])]:
            hosts.setdefault(host, []).append(name)
    jobs = yaml.safe_load(PROM_CONFIG.read_text())["scrape_configs"]
    scraped: set[str] = set()
    for target in (t for job in jobs for sc in job["static_configs"] for t in sc["targets"]):
        host, _, port = target.rpartition(":")
        answering = hosts.get(host, [])
        assert len(answering) == 1, f"scrape target {target}: services {answering}"
        svc = services[answering[0]]
        listens = {int(p) for p in svc.get("expose", [])} | {int(p["target"]) for p in svc.get("ports", [])}
        assert int(port) in listens, f"scrape target {target}: {answering[0]} listens on {sorted(listens)}"
        scraped.add(answering[0])
    assert scraped == {gateway, *workers}


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_v2_built_images_run_as_non_root(stack: str) -> None:
    stages = _stages()
    for name, svc in _services(stack).items():
        assert not svc.get("privileged"), f"{name} is privileged"
        assert str(svc.get("user", "")).split(":")[0] not in {"0", "root"}, f"{name} runs as root"
        if "build" not in svc:
            continue
        assert Path(svc["build"]["context"]) == ROOT and svc["build"]["dockerfile"] == "Dockerfile"
        assert "user" not in svc, f"{name} overrides the image's USER"
        idx = next(i for i, (_, stage, _) in enumerate(stages) if stage == svc["build"]["target"])
        uids = [args.split(":")[0] for instr, args in _chain(idx) if instr == "USER"]
        assert uids and uids[-1].isdigit() and int(uids[-1]) >= 1000, f"{name}: USER {uids} in the Dockerfile"


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_v2_gpu_reservations(stack: str) -> None:
    services = _services(stack)
    seen: set[str] = set()
    for name, svc in services.items():
        devices = ((svc.get("deploy") or {}).get("resources") or {}).get("reservations", {}).get("devices", [])
        if name not in VLLM_WORKERS:
            assert not devices, f"{name} reserves GPUs"
            continue
        assert svc["image"].startswith("vllm/vllm-openai:v")
        cmd = svc["command"]
        assert cmd[cmd.index("--scheduling-policy") + 1] == "priority"
        tp = int(cmd[cmd.index("--tensor-parallel-size") + 1])
        (dev,) = devices
        assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"] and not dev.get("count"), dev
        ids = set(dev["device_ids"])
        assert len(ids) == len(dev["device_ids"]) == tp, f"{name}: GPUs {dev['device_ids']} for tensor parallelism {tp}"
        assert not ids & seen, f"{name} shares GPUs with another worker"
        seen |= ids
    assert bool(seen) == ("gpu" in STACKS[stack][0]), "only the gpu profile reserves GPUs"


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_v2_config_mounted_read_only(stack: str) -> None:
    for name, svc in _services(stack).items():
        binds = [v for v in svc.get("volumes", []) if v["type"] == "bind"]
        assert {str(Path(v["source"]).relative_to(ROOT)): v["target"] for v in binds} == CONFIG_MOUNTS.get(name, {})
        for v in binds:
            assert v.get("read_only") is True, f"{name}: {v['source']} is mounted writable"
            # Compose creates a missing bind source as an empty directory: the config would silently be absent.
            assert v["target"] == "/models" or Path(v["source"]).exists(), f"{name}: {v['source']} does not exist"


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

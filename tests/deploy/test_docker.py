"""The container build and the compose stack: Dockerfile, .dockerignore, docker-compose.yml, deploy/compose/.

No container engine is needed: the Dockerfile is checked as text and docker-compose.yml is parsed with
PyYAML (profiles applied as Compose applies them). Compose v2 itself (``docker compose config``, which
needs no engine) also validates and renders the file, for the default profile, for ``--profile gpu`` and
for the services the gpu stack is started with, and the normalised JSON it prints is checked. Those tests
skip without Compose v2 unless ``HEXFLOW_REQUIRE_COMPOSE=1`` (set by .ci/run, which installs the plugin).

The one-shot job demo-data (the demo Text-to-SQL data) is also run here, its paths mapped into a temporary
folder, and one demo question goes through ``POST /v1/text2sql`` of a gateway configured by
deploy/compose/gateway.yaml in front of emulated workers started with the compose services' commands.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.cli import main as hexflow
from gateway.config.gateway import load_gateway_config
from gateway.live.tenants import TenantStore
from gateway.text2sql.answers import load_answers
from gateway.text2sql.db import DatabaseRegistry
from gateway.text2sql.demo import DB_ID, demo_questions
from gateway.text2sql.evaluate import execute_sqlite, gold_is_ordered, results_match
from tests.live.harness import BATCH_KEY, emulators, gateway_client
from workers.emulator import build_parser as emulator_parser
from workers.scripted import AnswersResponder

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
WORKERS = ["worker-a100-0", "worker-a100-1", "worker-a6000-0", "worker-l40s-0"]
VLLM_WORKERS = ["vllm-a100-0", "vllm-a100-1", "vllm-a6000-0", "vllm-l40s-0"]
DEMO_DATA = "demo-data"
"""The one-shot job that writes the demo Text-to-SQL data into the volume of the same name (every profile)."""
DEMO_VOLUME = "demo-data"
DEMO_WRITER_MOUNT = "/home/hexflow"  # the job's mount: the image user's home, so a new volume is writable by it
DEMO_READER_MOUNT = "/etc/hexflow/demo"  # the gateways' and emulated workers' read-only mount
COMPLETED = {"condition": "service_completed_successfully"}


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
    assert set(services) == {DEMO_DATA, "gateway", *WORKERS, "prometheus", "grafana"}
    gw = services["gateway"]
    assert "8080:8080" in gw["ports"]
    assert {DEMO_DATA: COMPLETED, **{w: {"condition": "service_healthy"} for w in WORKERS}} == gw["depends_on"]
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
    assert {DEMO_DATA: COMPLETED, **{w: {"condition": "service_healthy"} for w in VLLM_WORKERS}} == gw["depends_on"]
    assert "./deploy/compose/gateway-gpu.yaml:/etc/hexflow/gateway.yaml:ro" in gw["volumes"]
    # Prometheus scrapes worker-*:8000 and gateway:8080 whichever cluster runs.
    aliases = {a for n in [*VLLM_WORKERS, "gateway-gpu"] for a in services[n]["networks"]["default"]["aliases"]}
    assert aliases == {*WORKERS, "gateway"}


# ------------------------------------------------------------------- docker-compose, rendered by Compose v2
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DEFAULT_STACK = {DEMO_DATA, "gateway", *WORKERS, "prometheus", "grafana"}
GPU_STACK = {DEMO_DATA, "gateway-gpu", *VLLM_WORKERS, "prometheus", "grafana"}
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
            if dep == DEMO_DATA:  # a one-shot job: it is waited for until it has exited 0, not until healthy
                assert spec["condition"] == "service_completed_successfully", f"{name} starts before {dep} is done"
                continue
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
    assert {dep: spec["condition"] for dep, spec in gw["depends_on"].items()} == {
        DEMO_DATA: "service_completed_successfully",
        **dict.fromkeys(workers, "service_healthy"),
    }
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


# ------------------------------------------------------------- demo data: POST /v1/text2sql on the compose stack
# The one-shot job demo-data writes the demo database, its databases file and the scripted answers into the
# volume demo-data; the emulated workers (--answers) and the gateways (databases_file) read them read-only.
DEMO_FILES = {"databases": "databases.yaml", "answers": "answers.json"}  # subcommand -> file in the volume
READERS = {(): ["gateway", *WORKERS], ("gpu",): ["gateway", *WORKERS, "gateway-gpu"]}


def _short_volume(spec: str) -> tuple[str, str, bool]:
    """(source, target, read_only) of a short-syntax volume ``SOURCE:TARGET[:MODE]``."""
    parts = spec.split(":")
    return parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")


def _demo_mount(svc: dict[str, Any]) -> tuple[str, bool] | None:
    """(target, read_only) of a service's mount of the volume demo-data (PyYAML rendering), or None."""
    found = [(t, ro) for src, t, ro in map(_short_volume, svc.get("volumes", [])) if src == DEMO_VOLUME]
    assert len(found) <= 1, found
    return found[0] if found else None


def _demo_data_commands(job: dict[str, Any]) -> list[list[str]]:
    """The command lines of the demo-data job's shell script (``CMD && CMD ...``), in order."""
    assert job["entrypoint"] == ["sh", "-ec"], job["entrypoint"]
    (script,) = job["command"]
    commands: list[list[str]] = [[]]
    for token in shlex.split(script):
        if token == "&&":
            commands.append([])
        else:
            assert not set(token) & set(";|&<>`$"), f"the script is plain commands joined by &&: {script!r}"
            commands[-1].append(token)
    return commands


def _out_files(job: dict[str, Any]) -> dict[str, PurePosixPath]:
    """``hexflow`` subcommand -> the file it writes, relative to the job's mount of the volume."""
    out = {}
    for argv in _demo_data_commands(job):
        assert argv[:1] == ["hexflow"] and "--demo" in argv and "--spider" not in argv, argv
        out[argv[1]] = PurePosixPath(argv[argv.index("--out") + 1]).relative_to(DEMO_WRITER_MOUNT)
    return out


def _local(path: str, mount: str, volume: Path) -> Path:
    """A path inside a container's mount of the volume, as a path in ``volume`` (ValueError when outside)."""
    return volume.joinpath(*PurePosixPath(path).relative_to(mount).parts)


def test_dockerfile_user_owns_the_demo_data_mount() -> None:
    """A new named volume takes the owner of the folder it is first mounted on: the job mounts the home of the
    image's user, created by useradd --create-home, so the non-root job can write to it."""
    final = _final()
    uid = [args for instr, args in final if instr == "USER"][-1].split(":")[0]
    (useradd,) = [shlex.split(args) for instr, args in final if instr == "RUN" and "useradd" in args]
    assert "--create-home" in useradd and useradd[useradd.index("--uid") + 1] == uid
    assert f"/home/{useradd[-1]}" == DEMO_WRITER_MOUNT


@pytest.mark.parametrize("profiles", list(READERS), ids=["default", "gpu"])
def test_demo_data_job_and_its_readers(profiles: tuple[str, ...]) -> None:
    doc = _render_here(profiles)
    services = doc["services"]
    assert DEMO_VOLUME in doc["volumes"]
    job = services[DEMO_DATA]
    assert "profiles" not in job, "every profile's gateway needs the demo data"
    assert job["build"] == services["gateway"]["build"] and job["image"] == services["gateway"]["image"]
    assert "user" not in job and job["restart"] == "no"
    assert _demo_mount(job) == (DEMO_WRITER_MOUNT, False)
    assert _out_files(job) == {cmd: PurePosixPath(name) for cmd, name in DEMO_FILES.items()}
    assert "/home/hexflow/answers.json" in " ".join(job["healthcheck"]["test"])
    mounting = {name for name, svc in services.items() if _demo_mount(svc) is not None}
    assert mounting == {DEMO_DATA, *READERS[profiles]}
    for name in READERS[profiles]:
        svc = services[name]
        assert _demo_mount(svc) == (DEMO_READER_MOUNT, True), f"{name} mounts the demo data writable"
        assert svc["depends_on"][DEMO_DATA] == COMPLETED, f"{name} may start before the demo data is written"
    for w in WORKERS:
        cmd = services[w]["command"]
        assert cmd[cmd.index("--answers") + 1] == f"{DEMO_READER_MOUNT}/{DEMO_FILES['answers']}"


@pytest.mark.parametrize(
    ("gateway", "config"), [("gateway", "gateway.yaml"), ("gateway-gpu", "gateway-gpu.yaml")], ids=["default", "gpu"]
)
def test_compose_gateway_configs_name_the_demo_databases(gateway: str, config: str) -> None:
    services = _render_here(("gpu",))["services"]
    binds = dict(_short_volume(v)[:2] for v in services[gateway]["volumes"])
    assert binds[f"./deploy/compose/{config}"] == "/etc/hexflow/gateway.yaml"
    loaded = load_gateway_config(ROOT / "deploy" / "compose" / config)
    assert loaded.databases_path is not None
    written = _out_files(services[DEMO_DATA])["databases"]
    assert loaded.databases_path.as_posix() == f"{DEMO_READER_MOUNT}/{written}", "not the file demo-data writes"
    # The mounted tenants file lets every tenant query the demo database.
    tenants_src = next(src for src, dst in binds.items() if dst == loaded.tenants_path.as_posix())
    store = TenantStore.load(ROOT / tenants_src)
    assert store.tenants and all(t.allows(DB_ID) for t in store.tenants)


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_v2_demo_data_is_written_before_workers_and_gateways_and_read_only(stack: str) -> None:
    profiles, named, _ = STACKS[stack]
    doc = _compose_config(profiles, named)
    services = doc["services"]
    assert DEMO_VOLUME in doc["volumes"]
    job = services[DEMO_DATA]
    assert job["restart"] == "no" and "user" not in job and job["build"]["target"] == "gateway"
    mounts = {
        name: [v for v in svc.get("volumes", []) if v["type"] == "volume" and v["source"] == DEMO_VOLUME]
        for name, svc in services.items()
    }
    assert [(v["target"], bool(v.get("read_only"))) for v in mounts.pop(DEMO_DATA)] == [(DEMO_WRITER_MOUNT, False)]
    readers = {name for name, m in mounts.items() if m}
    emulated = {n for n in services if n in WORKERS}
    gateways = {n for n in services if n in {"gateway", "gateway-gpu"}}
    assert readers == emulated | gateways
    for name in readers:
        assert [(v["target"], v.get("read_only")) for v in mounts[name]] == [(DEMO_READER_MOUNT, True)], name
        assert services[name]["depends_on"][DEMO_DATA]["condition"] == "service_completed_successfully", name
    written = _out_files(job)
    for name in emulated:
        cmd = services[name]["command"]
        assert cmd[cmd.index("--answers") + 1] == f"{DEMO_READER_MOUNT}/{written['answers']}"


async def test_demo_data_job_run_here_then_one_question_end_to_end(tmp_path: Path) -> None:
    """The job's commands (paths mapped into a folder standing for the volume) write files that the compose
    gateway config and the emulated workers' --answers load; one demo question then ends with the gold rows."""
    services = _render_here(())["services"]
    volume = tmp_path / "volume"
    volume.mkdir()
    commands = [
        [str(_local(a, DEMO_WRITER_MOUNT, volume)) if a.startswith(f"{DEMO_WRITER_MOUNT}/") else a for a in argv]
        for argv in _demo_data_commands(services[DEMO_DATA])
    ]
    for argv in commands:
        assert hexflow(argv[1:]) == 0, argv
    first = {p.name: p.read_bytes() for p in volume.iterdir()}
    for argv in commands:  # idempotent: a second `up` writes the same files again and exits 0
        assert hexflow(argv[1:]) == 0, argv
    assert {p.name: p.read_bytes() for p in volume.iterdir()} == first
    assert set(first) == {"databases.yaml", "answers.json", f"{DB_ID}.sqlite"}

    # The gateway: deploy/compose/gateway.yaml, its databases_file mapped from the mount into the volume folder.
    raw = yaml.safe_load((ROOT / "deploy" / "compose" / "gateway.yaml").read_text())
    databases = _local(raw["databases_file"], DEMO_READER_MOUNT, volume)
    registry = DatabaseRegistry.from_file(databases)
    assert registry.ids() == [DB_ID]
    db_file = registry.config(DB_ID).sqlite_path()
    assert db_file == (volume / f"{DB_ID}.sqlite").resolve()
    # The workers: each compose worker's own command line; --answers mapped the same way.
    workers = raw["cluster"]["workers"]
    args = [emulator_parser().parse_args(services[urlsplit(w["url"]).hostname]["command"][1:]) for w in workers]
    assert [a.gpu for a in args] == [w["gpu"] for w in workers]
    (answers_path,) = {a.answers for a in args}
    answers = load_answers(_local(answers_path, DEMO_READER_MOUNT, volume))
    assert len(answers) == len(demo_questions())
    responder = AnswersResponder(dict(answers))

    q = next(q for q in demo_questions() if str(answers[q.question].get("note", "")).startswith("error"))
    time_scale = 0.01
    async with emulators([a.gpu for a in args], time_scale=time_scale, responder=responder) as urls:
        shutil.copy(ROOT / "config" / "tenants.yaml", tmp_path / "tenants.yaml")
        raw.update(
            time_scale=time_scale,
            tenants_file=str(tmp_path / "tenants.yaml"),
            databases_file=str(databases),
            health={"period_s": 0.2, "timeout_s": 1.0, "failures_to_down": 2},
            scrape={"period_s": 0.2, "timeout_s": 1.0},
            tuning={"enabled": False},
        )
        for w, url in zip(workers, urls, strict=True):
            w["url"] = url
        (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(raw))
        async with gateway_client(tmp_path / "gateway.yaml", key=BATCH_KEY) as (client, _):
            body = {"question": q.question, "db_id": DB_ID, "evidence": q.evidence}
            r = await client.post("/v1/text2sql", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "ok", out
    assert out["revisions"] == 1  # the scripted wrong first candidate failed and was revised to the gold
    gold = execute_sqlite(db_file, q.query)
    assert results_match(gold, out["rows"], ordered=gold_is_ordered(q.query)), (q.query, out["sql"])

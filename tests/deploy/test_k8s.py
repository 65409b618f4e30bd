"""The Kubernetes manifests (``deploy/k8s``): every overlay renders with kustomize and is safe to run.

Renders each overlay with ``kubectl kustomize`` (offline) and checks probes, pod security, resources,
shutdown timing against the gateway config, the tenants Secret, RBAC, the PDB and GPU scheduling.
Skipped where kubectl is not installed.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main as cli_main
from gateway.config.gateway import load_gateway_config
from gateway.core.profile import PerfProfile
from gateway.live.discovery import pod_worker

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
KUBECTL = shutil.which("kubectl")

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")

Doc = dict[str, Any]
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _render(overlay: str) -> list[Doc]:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


_CACHE: dict[str, list[Doc]] = {}


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    name: str = request.param
    if name not in _CACHE:
        _CACHE[name] = _render(name)
    return name, _CACHE[name]


def _of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind]


def _one(docs: list[Doc], kind: str, name_prefix: str) -> Doc:
    found = [d for d in _of_kind(docs, kind) if d["metadata"]["name"].startswith(name_prefix)]
    assert len(found) == 1, f"expected one {kind} {name_prefix}*, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def _gateway(docs: list[Doc]) -> Doc:
    return _one(docs, "Deployment", "hexflow-gateway")


def _gateway_container(docs: list[Doc]) -> Doc:
    containers: list[Doc] = _gateway(docs)["spec"]["template"]["spec"]["containers"]
    (c,) = [c for c in containers if c["name"] == "gateway"]
    return c


def _gateway_yaml(docs: list[Doc]) -> str:
    text: str = _one(docs, "ConfigMap", "hexflow-gateway-config")["data"]["gateway.yaml"]
    return text


def _write_profiles(docs: list[Doc], folder: Path) -> None:
    """The overlay's profiles ConfigMap (if any) next to gateway.yaml, as the projected volume mounts it."""
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("hexflow-profiles"):
            (folder / "profiles.yaml").write_text(d["data"]["profiles.yaml"])


def _tenants_secret(docs: list[Doc]) -> Doc:
    return _one(docs, "Secret", "hexflow-tenants")


def _secret_values(secret: Doc) -> dict[str, str]:
    values = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    values.update(secret.get("stringData") or {})
    return values


def _pod_specs(docs: list[Doc]) -> list[tuple[str, Doc]]:
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in WORKLOAD_KINDS
    ]


def _keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | set().union(*(_keys(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_keys(v) for v in node))
    return set()


def _prestop_sleep_s(container: Doc) -> float:
    pre = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre:
        return float(pre["sleep"]["seconds"])
    cmd = pre.get("exec", {}).get("command", [])
    return float(cmd[-1]) if cmd and cmd[0] == "sleep" else 0.0


def test_every_overlay_found() -> None:
    assert {"emulated", "gpu"} <= set(OVERLAYS)


def test_gateway_probes(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    c = _gateway_container(docs)
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == 8080
    assert c["args"][:3] == ["serve", "--config", "/etc/hexflow/gateway.yaml"]


def _leader_election(docs: list[Doc]) -> dict[str, Any]:
    return dict(yaml.safe_load(_gateway_yaml(docs)).get("leader_election") or {})


def test_gateway_rollout_and_service(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    dep = _gateway(docs)
    # Two replicas, one leader: only it is Ready, and only Ready pods get traffic. A rollout must be free to
    # stop the old leader before a new pod is Ready (a new pod is Ready only once it leads).
    assert dep["spec"]["replicas"] == 2
    assert _leader_election(docs).get("enabled") is True, "several replicas need leader election"
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "100%"},
    }
    svc = _one(docs, "Service", "hexflow-gateway")
    assert svc["spec"].get("publishNotReadyAddresses", False) is False
    assert svc["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in svc["spec"]["ports"]] == [8080]
    assert svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_gateway_security_context(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    pod = _gateway(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = _gateway_container(docs)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 10001
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert (sc.get("seccompProfile") or pod["securityContext"]["seccompProfile"])["type"] == "RuntimeDefault"
    mounts = {m["mountPath"] for m in _gateway_container(docs)["volumeMounts"]}
    assert "/tmp" in mounts  # the only writable path


def test_no_container_runs_as_root(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    for where, pod in _pod_specs(docs):
        pod_sc = pod.get("securityContext") or {}
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c.get("securityContext") or {}
            uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
            non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
            assert non_root is True, f"{where}/{c['name']}: runAsNonRoot not set"
            assert uid is not None and uid != 0, f"{where}/{c['name']}: runs as uid {uid}"
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}: privilege escalation allowed"
            assert not sc.get("privileged", False), f"{where}/{c['name']}: privileged"
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), f"{where}/{c['name']}: capabilities kept"


def test_resources_on_every_container(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    for where, pod in _pod_specs(docs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            res = c.get("resources") or {}
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(res.get(section, {})), f"{where}/{c['name']}: {section} missing"


def test_grace_period_covers_drain(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    grace_cfg = yaml.safe_load(_gateway_yaml(docs))["shutdown_grace_s"]
    pod = _gateway(docs)["spec"]["template"]["spec"]
    pre_stop = _prestop_sleep_s(_gateway_container(docs))
    assert pre_stop > 0, "a preStop sleep lets the endpoints go before SIGTERM"
    assert pod["terminationGracePeriodSeconds"] > grace_cfg + pre_stop


def test_tenants_secret_mounted(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    secret = _tenants_secret(docs)
    tenants = yaml.safe_load(_secret_values(secret)["tenants.yaml"])
    assert tenants["tenants"]
    for t in tenants["tenants"]:
        assert t["api_key_sha256"] and all(SHA256.match(h) for h in t["api_key_sha256"]), t["name"]

    pod = _gateway(docs)["spec"]["template"]["spec"]
    name = secret["metadata"]["name"]
    mounted = {}  # volume name -> path of tenants.yaml inside it
    for v in pod["volumes"]:
        if v.get("secret", {}).get("secretName") == name:
            mounted[v["name"]] = "tenants.yaml"
        for src in v.get("projected", {}).get("sources", []):
            if src.get("secret", {}).get("name") == name:
                items = {i["key"]: i["path"] for i in src["secret"].get("items", [])}
                mounted[v["name"]] = items.get("tenants.yaml", "tenants.yaml")
    assert mounted, "the gateway does not mount the tenants Secret"
    paths = {
        f"{m['mountPath'].rstrip('/')}/{mounted[m['name']]}"
        for m in _gateway_container(docs)["volumeMounts"]
        if m["name"] in mounted
    }
    assert yaml.safe_load(_gateway_yaml(docs))["tenants_file"] in paths


def test_no_secret_material_in_plain_manifests(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    secrets = [v for s in _of_kind(docs, "Secret") for v in _secret_values(s).values()]
    digests = {h for s in secrets for h in re.findall(r"[0-9a-f]{64}", s)}
    assert digests
    for cm in _of_kind(docs, "ConfigMap"):
        for key, text in (cm.get("data") or {}).items():
            assert not any(s.strip() in text for s in secrets), f"{cm['metadata']['name']}/{key} holds Secret data"
            assert not digests & set(re.findall(r"[0-9a-f]{64}", text)), f"{cm['metadata']['name']}/{key}"
    # No plaintext API keys anywhere: not as manifest fields, nor inside the embedded YAML files.
    embedded = [yaml.safe_load(t) for cm in _of_kind(docs, "ConfigMap") for t in (cm.get("data") or {}).values()]
    embedded += [yaml.safe_load(s) for s in secrets]
    for node in docs + embedded:
        bad = {k for k in _keys(node) if isinstance(k, str) and k.lower() in {"api_key", "api_keys", "apikey"}}
        assert not bad, bad
    for d in docs:
        for c in (
            (d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []))
            if d["kind"] in WORKLOAD_KINDS
            else []
        ):
            for env in c.get("env", []):
                assert "value" not in env or "key" not in env["name"].lower(), f"{c['name']}: {env['name']} inlined"


def test_rendered_gateway_config_loads(rendered: tuple[str, list[Doc]], tmp_path: Path) -> None:
    name, docs = rendered
    raw = yaml.safe_load(_gateway_yaml(docs))
    assert raw["tenants_file"] == "/etc/hexflow/secrets/tenants.yaml"
    shutil.copy(REPO / "config" / "tenants.yaml", tmp_path / "tenants.yaml")
    raw["tenants_file"] = str(tmp_path / "tenants.yaml")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw))
    _write_profiles(docs, tmp_path)
    loaded = load_gateway_config(path)
    assert loaded.tenants_path == tmp_path / "tenants.yaml"
    assert loaded.cfg.listen.port == 8080

    kube = loaded.cfg.discovery.kubernetes if loaded.cfg.discovery is not None else None
    assert kube is not None, "the overlays discover their workers from pods"
    assert loaded.cfg.cluster is None, "no static worker list to keep in step with the replicas"
    assert kube.api_url is None and kube.token_file.startswith("/var/run/secrets/kubernetes.io/serviceaccount/")
    assert kube.watch and kube.period_s <= 30
    le = loaded.cfg.leader_election
    assert le.enabled and le.api_url is None and le.namespace is None and le.identity is None
    assert le.token_file == kube.token_file
    if name == "emulated":
        assert loaded.cfg.time_scale == 0.05
    else:
        assert loaded.cfg.time_scale == 1.0


def _selected(selector: str, labels: dict[str, str]) -> bool:
    for term in selector.split(","):
        k, v = term.split("=", 1)
        if labels.get(k) != v:
            return False
    return True


def test_discovery_finds_every_worker_pod(rendered: tuple[str, list[Doc]], tmp_path: Path) -> None:
    """Each worker pod template, given an IP, is a worker for the gateway's discovery; nothing else is."""
    name, docs = rendered
    raw = yaml.safe_load(_gateway_yaml(docs))
    raw["tenants_file"] = str(REPO / "config" / "tenants.yaml")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw))
    _write_profiles(docs, tmp_path)
    loaded = load_gateway_config(path)
    assert loaded.cfg.discovery is not None and loaded.cfg.discovery.kubernetes is not None
    kube = loaded.cfg.discovery.kubernetes
    replicas = 0
    gpus = set()
    named: list[tuple[PerfProfile, str]] = []
    for d in docs:
        if d["kind"] not in WORKLOAD_KINDS:
            continue
        tmpl = d["spec"]["template"]
        labels = tmpl["metadata"]["labels"]
        if d["metadata"]["name"].startswith("hexflow-gateway"):
            assert not _selected(kube.label_selector, labels), "the gateway must not discover itself"
            continue
        assert _selected(kube.label_selector, labels), f"{d['metadata']['name']} is not selected"
        pod = {
            "metadata": {"name": f"{d['metadata']['name']}-0", **tmpl["metadata"]},
            "spec": tmpl["spec"],
            "status": {"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        pw = pod_worker(pod, kube, loaded.default_model)
        assert pw is not None and pw.ready
        (c,) = tmpl["spec"]["containers"]
        (http,) = [p for p in c["ports"] if p["name"] == "http"]
        assert pw.url == f"http://10.1.2.3:{http['containerPort']}"
        loaded.catalog.profile(pw.gpu, pw.model)  # a known GPU/model pair: raises otherwise
        if pw.profile is not None:  # a named profile must exist (the profiles ConfigMap): raises otherwise
            named.append(loaded.catalog.named_profile(pw.profile, pw.model))
        assert c["readinessProbe"]["httpGet"]["port"] in ("http", http["containerPort"]), "Ready means serving"
        served = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--served-model-name=")]
        if served:
            assert served == [pw.served_model], "requests name the model the engine serves"
        replicas += d["spec"].get("replicas", 1)
        gpus.add(pw.gpu)
    assert replicas >= 3 and len(gpus) >= 2, "a mixed cluster"
    gw_spec = _gateway(docs)["spec"]["template"]["spec"]
    assert gw_spec.get("automountServiceAccountToken", True), "discovery authenticates with the pod's token"
    if name == "emulated":
        assert sorted(gpus) == ["A100", "A6000", "L40S"] and replicas == 4
    else:  # the gpu overlay shows a pool scheduled with its calibrated profile from the profiles file
        assert [(p.name, source) for p, source in named] == [("l40s-calibrated/llama-3.1-70b", "file")]


def test_rbac_reads_pods_and_holds_only_its_lease(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    assert not _of_kind(docs, "ClusterRole") and not _of_kind(docs, "ClusterRoleBinding")
    roles = {r["metadata"]["name"]: r for r in _of_kind(docs, "Role")}
    assert set(roles) == {"hexflow-gateway-discovery", "hexflow-gateway-leader-election"}
    for rule in roles["hexflow-gateway-discovery"]["rules"]:
        assert rule["apiGroups"] == [""]
        assert set(rule["resources"]) == {"pods"}
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
    lease = _leader_election(docs).get("lease_name", "hexflow-gateway")
    granted: set[str] = set()
    for rule in roles["hexflow-gateway-leader-election"]["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
        assert set(rule["verbs"]) <= {"get", "create", "update"}
        if "create" not in rule["verbs"]:
            assert rule["resourceNames"] == [lease], "get/update only on the gateway's own Lease"
        granted |= set(rule["verbs"])
    assert granted == {"get", "create", "update"}
    sa = _gateway(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    for binding in _of_kind(docs, "RoleBinding"):
        assert binding["roleRef"]["name"] in roles
        assert {"kind": "ServiceAccount", "name": sa, "namespace": "hexflow"} in binding["subjects"]
    assert {b["roleRef"]["name"] for b in _of_kind(docs, "RoleBinding")} == set(roles)
    assert any(d["metadata"]["name"] == sa for d in _of_kind(docs, "ServiceAccount"))


def test_pod_name_is_the_lease_identity_and_followers_spread(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    env = {e["name"]: e for e in _gateway_container(docs)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "identity" not in _leader_election(docs), "each replica's identity is its own pod name"
    probe = _gateway_container(docs)["readinessProbe"]
    assert probe["httpGet"]["path"] == "/readyz"
    le = _leader_election(docs)
    # A leader that steps down leaves the endpoints within a probe; a new one joins within a probe.
    assert probe["periodSeconds"] * probe["failureThreshold"] <= le["retry_period_s"]
    anti = _gateway(docs)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_no_pdb_counts_ready_pods_when_only_the_leader_is_ready(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    # Only the leader is Ready: a budget over Ready pods would block every drain of the leader's node.
    assert not _of_kind(docs, "PodDisruptionBudget")


def test_the_base_alone_is_one_replica_with_a_pdb() -> None:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / "base")], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    dep = _gateway(docs)
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    (pdb,) = _of_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_everything_in_namespace(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    assert [d["metadata"]["name"] for d in _of_kind(docs, "Namespace")] == ["hexflow"]
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "hexflow", f"{d['kind']}/{d['metadata']['name']}"


def test_workers_carry_discovery_labels(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    cfg = yaml.safe_load(_gateway_yaml(docs))
    seen = set()
    for d in docs:
        if d["kind"] not in WORKLOAD_KINDS or d["metadata"]["name"].startswith("hexflow-gateway"):
            continue
        meta = d["spec"]["template"]["metadata"]
        assert meta["labels"]["hexflow.io/role"] == "worker"
        seen.add(meta["labels"]["hexflow.io/gpu"])
        assert int(meta["annotations"]["hexflow.io/capacity"]) >= 1
        assert meta["annotations"]["hexflow.io/model"] == cfg["discovery"]["kubernetes"]["default_model"]
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert "priority" in " ".join(c["args"]), "workers must schedule by priority"
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert len(seen) >= 2


def test_gpu_workers_request_gpus() -> None:
    if "gpu" not in OVERLAYS:
        pytest.skip("no gpu overlay")
    docs = _CACHE.get("gpu") or _render("gpu")
    workers = [
        d
        for d in _of_kind(docs, "StatefulSet")
        if d["spec"]["template"]["metadata"]["labels"].get("hexflow.io/role") == "worker"
    ]
    assert {w["metadata"]["name"] for w in workers} == {"vllm-a100", "vllm-l40s"}
    for w in workers:
        pod = w["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["nvidia.com/gpu.product"]
        (c,) = pod["containers"]
        n = int(c["resources"]["limits"]["nvidia.com/gpu"])
        assert n >= 1
        tp = [a for a in c["args"] if a.startswith("--tensor-parallel-size")]
        assert tp and int(tp[0].split("=")[1]) == n, "one GPU per tensor-parallel rank"
        assert "--scheduling-policy=priority" in c["args"]
    products = {
        w["metadata"]["name"]: w["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] for w in workers
    }
    assert products == {"vllm-a100": "NVIDIA-A100-SXM4-80GB", "vllm-l40s": "NVIDIA-L40S"}


def test_emulated_overlay_serves_text2sql_on_the_demo_data(tmp_path: Path) -> None:
    """Init containers write the demo database (gateway) and answers (workers) where the main containers read them."""
    if "emulated" not in OVERLAYS:
        pytest.skip("no emulated overlay")
    docs = _CACHE.setdefault("emulated", _render("emulated"))
    cfg = yaml.safe_load(_gateway_yaml(docs))
    pods = [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs if d["kind"] in WORKLOAD_KINDS]
    assert len(pods) == 5
    for name, pod in pods:
        (init,) = pod["initContainers"]
        (main,) = pod["containers"]
        out = init["command"][init["command"].index("--out") + 1]
        wanted = (
            cfg["databases_file"]
            if name.startswith("hexflow-gateway")
            else main["args"][main["args"].index("--answers") + 1]
        )
        assert out == wanted, name
        mounts = {m["name"]: m for m in main["volumeMounts"]}
        (vol,) = [m for m in init["volumeMounts"] if out.startswith(m["mountPath"] + "/")]
        assert mounts[vol["name"]]["mountPath"] == vol["mountPath"] and mounts[vol["name"]]["readOnly"] is True
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == vol["name"])
        # The init command works: run it with its output mapped into tmp_path.
        local = tmp_path / name / Path(out).name
        argv = [a if a != out else str(local) for a in init["command"][1:]]
        assert init["command"][0] == "hexflow"
        assert cli_main(argv) == 0 and local.is_file()


def test_the_emulated_overlay_runs_the_image_the_readme_builds_and_loads() -> None:
    """kind/minikube: every container of ours runs hexgen-flow:latest, never pulled (the README builds it with
    the Dockerfile and loads it into the nodes); the gpu overlay keeps the registry placeholder to replace."""
    docs = _CACHE.setdefault("emulated", _render("emulated"))
    ours = [
        c
        for d in docs
        if d.get("kind") in WORKLOAD_KINDS
        for c in [
            *d["spec"]["template"]["spec"].get("initContainers", []),
            *d["spec"]["template"]["spec"]["containers"],
        ]
    ]
    assert ours and {c["image"] for c in ours} == {"hexgen-flow:latest"}
    assert {c.get("imagePullPolicy") for c in ours} == {"IfNotPresent"}
    readme = " ".join((K8S / "README.md").read_text(encoding="utf-8").split())
    for step in (
        "docker build -t hexgen-flow:latest .",
        "kind load docker-image hexgen-flow:latest",
        "minikube image load hexgen-flow:latest",
        "kubectl apply -k deploy/k8s/overlays/emulated",
    ):
        assert step in readme, step
    assert readme.index("docker build") < readme.index("kubectl apply -k deploy/k8s/overlays/emulated")
    assert "docker build -t hexgen-flow:latest ." in (REPO / "Dockerfile").read_text(encoding="utf-8")

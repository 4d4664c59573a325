"""deploy/kubernetes/ checked offline: every built-in resource against the Kubernetes 1.30 schemas
(kubernetes-validate, strict: no unknown fields), the KEDA ScaledObject and the ServiceMonitor
against the fields their CRDs define, and the pieces against each other and against Lyre itself
(its config loads, its ports, flags, probes and metric names exist, the drain fits the grace period)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from lyre.config import load_config
from lyre.core.metrics import Metrics
from tests.support.install import script_help
from tests.support.paths import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "kubernetes"
VERSION = "1.30.0"
CRDS = {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "ServiceMonitor")}


def documents() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in sorted(K8S.rglob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind: str, folder: Path = K8S, name: str | None = None) -> dict:
    found = [d for p, d in documents() if d["kind"] == kind and p.parent == folder
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name)
    return found[0]


def lyre() -> dict:
    return one("Deployment", name="lyre")


def container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("path, doc", [(p, d) for p, d in documents() if (d["apiVersion"], d["kind"]) not in CRDS],
                         ids=lambda x: x.name if isinstance(x, Path) else x["kind"])
def test_every_resource_is_valid_for_kubernetes_1_30(path, doc):
    """(The custom resources are checked against their CRDs' fields below.)"""
    kubernetes_validate.validate(doc, VERSION, strict=True)
    assert doc["metadata"].get("namespace", "lyre") == "lyre" or doc["kind"] == "Namespace"


def test_the_validation_catches_mistakes():
    bad = lyre()
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSION, strict=True)


def test_the_keda_scaled_object_and_service_monitor_have_their_crds_fields():
    scaled = one("ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert set(scaled["spec"]) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval",
                                   "cooldownPeriod", "triggers", "advanced", "fallback", "idleReplicaCount"}
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert set(behavior) <= {"scaleUp", "scaleDown"} and behavior["scaleDown"]["policies"][0]["type"] == "Pods"
    assert scaled["spec"]["scaleTargetRef"]["name"] == lyre()["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and set(trigger["metadata"]) == {"serverAddress", "query", "threshold"}
    assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA's metadata is a string map
    assert float(trigger["metadata"]["threshold"]) < 1
    # AverageValue (KEDA's default): replicas = sum over the pods / threshold, so the query is a sum
    assert trigger["metadata"]["query"].startswith("sum(") and "metricType" not in trigger
    monitor = one("ServiceMonitor")
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    service_ports = {p["name"] for p in one_service("lyre-pods")["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"} and endpoint["port"] in service_ports
        assert endpoint["path"] == "/metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= one_service("lyre-pods")["metadata"]["labels"].items()


def one_service(name: str) -> dict:
    return next(d for _, d in documents() if d["kind"] == "Service" and d["metadata"]["name"] == name)


def test_autoscaling_uses_a_metric_lyre_exports():
    names = {m.name for m in Metrics().registry.collect()}
    assert "lyre_capacity_utilisation" in names
    scaled = one("ScaledObject")
    assert re.search(r"\blyre_capacity_utilisation\b", scaled["spec"]["triggers"][0]["metadata"]["query"])
    hpa = one("HorizontalPodAutoscaler", K8S / "alternatives")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "lyre_capacity_utilisation"
    assert hpa["spec"]["scaleTargetRef"]["name"] == lyre()["metadata"]["name"]


def test_the_embedded_config_loads_and_the_drain_fits_the_grace_period(tmp_path):
    config_file = tmp_path / "model_config.yaml"
    config_file.write_text(one("ConfigMap", name="lyre-config")["data"]["model_config.yaml"])
    cfg = load_config(config_file)
    spec = lyre()["spec"]["template"]["spec"]
    pre_stop = int(container(lyre())["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + cfg.server.drain_timeout_s + 10
    mounts = {m["name"]: m for m in container(lyre())["volumeMounts"]}
    assert cfg.build.engine_dir.startswith(mounts["engines"]["mountPath"]) and mounts["engines"]["readOnly"]
    assert cfg.model.path is None and not cfg.model.allow_demo and cfg.model.backend == "trtllm"
    dockerfile = (REPO_ROOT / "docker" / "gpu.Dockerfile").read_text()  # the weights: the HF cache on the volume
    assert re.search(rf"HF_HOME={re.escape(mounts['models']['mountPath'])}/", dockerfile)
    assert cfg.server.trusted_proxies  # the balancer's pod network: per-client limits count real clients
    job_mounts = {m["name"]: m for m in one("Job")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert not job_mounts["engines"].get("readOnly")  # the build writes what the servers read


def test_the_deployment_runs_lyre_as_it_is_and_probes_what_it_serves():
    deployment = lyre()
    c = container(deployment)
    args = c["args"]
    assert args[:2] == ["python", "production_server.py"]
    help_text = script_help("production_server.py")
    for flag in (a for a in args if a.startswith("--")):
        assert flag in help_text, flag
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": int(args[args.index("--port") + 1]), "grpc": int(args[args.index("--grpc-port") + 1])}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["grpc"]["port"] == ports["grpc"] and c["livenessProbe"]["grpc"]["service"] == ""
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    http = (REPO_ROOT / "src" / "lyre" / "api" / "http" / "app.py").read_text()
    assert 'add_get("/ready"' in http and 'add_get("/health"' in http
    env = {e["name"]: e for e in c["env"]}
    # no secret in argv (any process on the node can read it): the database URL and the API keys
    # come from the environment, which Lyre reads itself
    assert "database_url" not in " ".join(args) and "$(" not in " ".join(args)
    from lyre.storage.db import DATABASE_URL_ENV
    from lyre.trust.accounts import API_KEYS_ENV
    from lyre.trust.tokens import SECRET_ENV
    assert {DATABASE_URL_ENV, API_KEYS_ENV, SECRET_ENV} <= env.keys()  # (replicas share the token secret)
    secret = env["LYRE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert secret["name"] == one("Secret", K8S / "examples")["metadata"]["name"] and secret["key"] in one("Secret", K8S / "examples")["stringData"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1  # one replica per GPU
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pods = one_service("lyre-pods")
    assert pods["spec"]["selector"].items() <= labels.items() and pods["spec"]["clusterIP"] == "None"
    assert {p["targetPort"] for p in pods["spec"]["ports"]} == set(ports)
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    claims = {v["persistentVolumeClaim"]["claimName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims <= {d["metadata"]["name"] for _, d in documents() if d["kind"] == "PersistentVolumeClaim"}


def compose_rules_with_dns_discovery() -> str:
    """deploy/compose/haproxy.cfg as the cluster runs it: the replicas from the headless Service's
    DNS records instead of the compose names."""
    cfg = (REPO_ROOT / "deploy" / "compose" / "haproxy.cfg").read_text()
    cfg = "global\n" + cfg.split("\nglobal\n", 1)[1]
    cfg = re.sub(r"# Docker's DNS.*?hold valid 5s\n", "# the cluster's DNS: the replicas are the records of the headless "
                 "Service lyre-pods\nresolvers k8s\n    parse-resolv-conf\n    hold valid 5s\n", cfg, flags=re.S)
    cfg = cfg.replace("resolvers docker init-addr last,libc,none", "resolvers k8s init-addr none")
    for part, port, extra in (("http", 8000, ""), ("grpc", 50051, " proto h2")):
        checked = " check port 8000 check-proto h1" if part == "grpc" else " check"
        cfg = re.sub(rf"    # replicas \({part}\) begin\n.*?    # replicas \({part}\) end\n",
                     f"    server-template lyre 16 lyre-pods.lyre.svc.cluster.local:{port}{extra}{checked}\n"
                     f"    server-template lyre-any 16 lyre-pods.lyre.svc.cluster.local:{port}{extra} backup\n",
                     cfg, flags=re.S)
    return cfg


def test_the_in_cluster_balancer_runs_the_compose_rules_and_is_valid_haproxy(tmp_path):
    import shutil

    embedded = one("ConfigMap", name="lyre-balancer")["data"]["haproxy.cfg"]
    assert embedded == compose_rules_with_dns_discovery()  # one set of rules, kept the same
    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    assert binary, "HAProxy is not installed (./setup.sh --with-test-services installs it)"
    (tmp_path / "haproxy.cfg").write_text(embedded)
    check = subprocess.run([binary, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    balancer = one("Deployment", name="lyre-balancer")
    entry = one_service("lyre")
    assert entry["spec"]["selector"].items() <= balancer["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"] for p in balancer["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in entry["spec"]["ports"]} <= ports
    monitor = one("ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert not monitor.items() <= entry["metadata"]["labels"].items()  # Prometheus scrapes replicas, not HAProxy
    assert one("ScaledObject")["spec"]["maxReplicaCount"] <= 16  # the server-template slots

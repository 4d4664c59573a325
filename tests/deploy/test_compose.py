"""deploy/compose (Docker Compose: replicas, HAProxy, PostgreSQL, Prometheus, Grafana) and the
Grafana dashboard, checked statically (no container runtime here): the pieces refer to each other
and to Lyre correctly (the dashboard's metrics against a real server: tests/deploy/test_dashboard.py)."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.support.install import script_help
from tests.support.paths import REPO_ROOT

COMPOSE = REPO_ROOT / "deploy" / "compose"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "lyre-dashboard.json"


def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def replicas() -> dict[str, dict]:
    return {name: s for name, s in compose()["services"].items() if name.startswith("lyre")}


def test_the_compose_topology_holds_together():
    services = compose()["services"]
    assert set(services) == {"lyre1", "lyre2", "haproxy", "postgres", "prometheus", "grafana"}
    help_text = script_help("production_server.py")
    for name, service in replicas().items():
        command = service["command"]
        assert command[:2] == ["python", "production_server.py"]
        assert all(flag in help_text for flag in command if flag.startswith("--")), name
        sets = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--set")
        assert sets["voices.database_url"].startswith("postgresql+psycopg://lyre:lyre@postgres:5432/lyre")
        drain = float(sets["server.drain_timeout_s"])
        assert float(service["stop_grace_period"].rstrip("s")) > drain  # streams finish before the stop
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    # the balancer's checked and backup servers are exactly the replicas, on their ports
    cfg = (COMPOSE / "haproxy.cfg").read_text()
    http_servers = re.findall(r"server (\S+) (\S+):8000 check\n", cfg)
    grpc_servers = re.findall(r"server (\S+) (\S+):50051 proto h2 check port 8000 check-proto h1\n", cfg)
    assert {h for _, h in http_servers} == {h for _, h in grpc_servers} == set(replicas())
    assert re.findall(r"balance leastconn", cfg) and "option httpchk GET /ready" in cfg
    haproxy = services["haproxy"]
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in haproxy["volumes"]
    assert {"8000:8000", "50051:50051", "8404:8404"} == set(haproxy["ports"])
    # Prometheus scrapes every replica directly; Grafana is provisioned with it and the dashboard
    scrape = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    assert set(scrape["static_configs"][0]["targets"]) == {f"{r}:8000" for r in replicas()}
    grafana = services["grafana"]["volumes"]
    for mount in grafana:
        source = mount.split(":")[0]
        assert (COMPOSE / source).resolve().is_file(), source
    assert any(m.startswith("../grafana/lyre-dashboard.json:") for m in grafana)
    datasource = yaml.safe_load((COMPOSE / "grafana" / "datasources.yml").read_text())["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"


def test_the_haproxy_configuration_is_valid_haproxy():
    """(haproxy -c: the compose file as it ships, its service names resolved to loopback.)"""
    import shutil
    import tempfile

    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    assert binary, "HAProxy is not installed (./setup.sh --with-test-services installs it)"
    with tempfile.TemporaryDirectory() as tmp:
        text = re.sub(r"\blyre(\d)(?=:)", "127.0.0.1", (COMPOSE / "haproxy.cfg").read_text())
        text = text.replace("127.0.0.11:53", "127.0.0.1:53")
        path = f"{tmp}/haproxy.cfg"
        open(path, "w").write(text)
        check = subprocess.run([binary, "-c", "-f", path], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

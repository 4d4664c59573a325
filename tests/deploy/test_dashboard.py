"""Every metric the Grafana dashboard (deploy/grafana/lyre-dashboard.json) queries exists in a real
server's /metrics."""

from __future__ import annotations

import json
import re

import requests

from tests.support.paths import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "lyre-dashboard.json"


def dashboard_series() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert exprs and all(p["datasource"]["uid"] == "${datasource}" for p in board["panels"])
    return {name for e in exprs for name in re.findall(r"\blyre_[a-z_]+", e)}


def test_every_metric_the_dashboard_queries_exists_in_metrics(server):
    text = requests.get(server.http + "/metrics", timeout=10).text
    families = set(re.findall(r"^# TYPE (\S+) (\w+)$", text, re.M))
    names = {name for name, _ in families}
    histograms = {name for name, kind in families if kind == "histogram"}
    series = dashboard_series()
    assert {"lyre_ttfb_seconds_bucket", "lyre_capacity_utilisation", "lyre_active_sessions", "lyre_pending_sessions",
            "lyre_tokens_total", "lyre_codec_frames_emitted_total", "lyre_rejections_total",
            "lyre_late_chunks_total"} <= series  # what operators watch
    for s in series:
        family = re.sub(r"_(bucket|sum|count)$", "", s)
        assert s in names or (family in histograms and family != s), f"{s} is not in /metrics"

"""The Grafana dashboard in docs/grafana asks only for series that `chatcache serve` exposes.

The names are read from the source of `chatcache/serving/metrics.py`, not from a running server,
so the check needs no model. A renamed metric, or a panel that forgets the `_total` or `_bucket`
that prometheus_client adds, fails here and not as an empty panel in Grafana.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "chatcache-serve.json"
METRICS_SOURCE = ROOT / "chatcache" / "serving" / "metrics.py"

# Digits too: with [a-z_] alone, "e2e_request_latency_seconds" would be read as "e".
NAME = re.compile(r"chatcache:[A-Za-z0-9_]+")
SUFFIX = re.compile(r"_(bucket|sum|count|total)$")
# What prometheus_client appends to each kind of metric in the text it serves.
SUFFIXES = {"Histogram": {"_bucket", "_sum", "_count"}, "Counter": {"_total"}, "CounterMetricFamily": {"_total"}, "GaugeMetricFamily": {""}}


def declared_metrics() -> dict[str, str]:
    """Each base name metrics.py declares, with the class that declares it."""
    source = METRICS_SOURCE.read_text()
    kinds = {name: kind for kind, name in re.findall(r'\b(\w+)\(\s*"(chatcache:[A-Za-z0-9_]+)"', source)}
    # The KV counters are declared in one loop, as f"chatcache:{name}" over ("kv_spills", kv.spills, ...) rows.
    assert 'CounterMetricFamily(f"chatcache:{name}"' in source
    kinds |= {f"chatcache:{name}": "CounterMetricFamily" for name in re.findall(r'\("([A-Za-z0-9_]+)", kv\.', source)}
    assert set(re.findall(r'"(chatcache:[A-Za-z0-9_]+)"', source)) <= kinds.keys()
    return kinds


def expressions() -> list[str]:
    def walk(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["expr"]] if isinstance(node.get("expr"), str) else []
            return found + [e for value in node.values() for e in walk(value)]
        if isinstance(node, list):
            return [e for value in node for e in walk(value)]
        return []

    return walk(json.loads(DASHBOARD.read_text()))


def test_every_series_in_a_panel_is_one_the_server_exposes() -> None:
    kinds = declared_metrics()
    used = {name for expr in expressions() for name in NAME.findall(expr)}
    assert used, "the dashboard queries no chatcache metric"
    for series in sorted(used):
        base = SUFFIX.sub("", series)
        assert base in kinds, f"{series}: metrics.py declares no {base}"
        suffix = series[len(base) :]
        assert suffix in SUFFIXES[kinds[base]], f"{series}: a {kinds[base]} is not served with {suffix or 'no suffix'}"


def test_every_panel_queries_the_imported_data_source() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] == 39
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{panel['title']} has no query"
        for ref in [panel["datasource"]] + [t["datasource"] for t in panel["targets"]]:
            assert ref == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]

"""The Grafana dashboard and the alerting rules in docs/ use only metrics qpid-flow exposes,
and the dashboard shows every per-destination family (a renamed metric fails here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from qpid_flow.admin.metrics import METRICS, exposed_name

DOCS = Path(__file__).resolve().parents[2] / "docs"
NAME = re.compile(r"\bqpid_flow_[a-z_]+\b")
EXPOSED = {exposed_name(spec) for spec in METRICS}


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DOCS / "grafana" / "qpid-flow-dashboard.json").read_text())
    return loaded


def _expressions(text: str) -> set[str]:
    return set(NAME.findall(text))


def test_the_dashboard_is_well_formed() -> None:
    panels = _dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["type"] and panel["title"]
        for target in panel.get("targets", []):
            assert target["expr"].strip(), panel["title"]


def test_the_dashboard_and_alerts_use_only_exposed_metrics() -> None:
    used = set()
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            used |= _expressions(target["expr"])
    for variable in _dashboard()["templating"]["list"]:
        used |= _expressions(str(variable.get("query", "")))
    rules = yaml.safe_load((DOCS / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            used |= _expressions(rule["expr"])
    assert used - EXPOSED == set()


def test_every_per_destination_family_is_on_the_dashboard() -> None:
    text = json.dumps(_dashboard())
    missing = [exposed_name(s) for s in METRICS if s.labels == ("destination",) and exposed_name(s) not in text]
    assert missing == []

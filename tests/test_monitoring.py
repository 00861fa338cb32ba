"""The shipped alert rules and Grafana dashboard (docs/monitoring/) query only series a real app
exports, and the budget gauge they compare the hedge rate with is served.

The app is the real one (its lifespan running, records ingested over its HTTP api, a controller
tick run) and ``/metrics`` is parsed with prometheus-client's own parser. The rules' semantics are
tested by promtool (``promtool test rules docs/monitoring/hedgerow-alerts.test.yml``, a CI step);
here promtool, when installed, also parses every dashboard query.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hedgerow.api.app import create_app
from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.settings import Settings

MONITORING = Path(__file__).resolve().parent.parent / "docs" / "monitoring"
ALERTS = MONITORING / "hedgerow-alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"

#: PromQL words that look like series names but are not.
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
_KEYWORDS |= {"inf", "nan"}
_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL ``expr`` selects (Grafana's ``$variables`` allowed).

    Strings, label matchers ``{...}``, range and subquery brackets ``[...]`` and the label lists of
    ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` are removed first; what is
    left that looks like a name, is not a keyword and is not called like a function is a series.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, called = match.group(1), match.group(2)
        if not called and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _failover(request_id: str, call_factory: Any) -> CallRecord:
    base = call_factory(request_id, route="chat", model="m1")
    attempts = (
        AttemptRecord("a", "primary", 0.0, None, 0.1, "failed", 503, "http_503", 0),
        AttemptRecord("b", "backup", 0.1, 0.5, 1.5, "won", 200, None, 20),
    )
    return CallRecord(
        request_id, "chat", "m1", base.started_at, hedged=True, hedge_reason="primary_error", winner="backup",
        ttft_s=0.5, ttfo_s=0.5, tpot_s=0.05, e2e_s=1.5, prompt_tokens=100, completion_tokens=20, attempts=attempts,
    )  # fmt: skip


async def _scrape(database_url: str, call_factory: Any) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``/metrics`` of a real app after ingesting hedged, failed and failed-over calls on two
    routes (route ``r`` with budget 0.05, ``chat`` on the default) and one controller tick."""
    settings = Settings(database_url=database_url, controller_interval_s=3600.0, allowed_hosts="hedgerow.test")
    app = create_app(settings)
    records = [_failover("f1", call_factory), call_factory("e1", route="chat", model="m1", primary_ttft_s=None)]
    records += [
        call_factory(f"h{i}", route="chat", model="m1", primary_ttft_s=3.0, hedge_after_s=1.0, backup_ttft_s=0.3)
        for i in range(3)
    ]
    records += [call_factory(f"p{i}", route="r", model="m1", primary_ttft_s=0.4) for i in range(5)]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://hedgerow.test") as api:
            put = await api.put("/v1/routes/r", params={"model": "m1"}, json={"budget": 0.05})
            assert put.status_code < 300, put.text
            posted = await api.post("/v1/calls", json={"calls": [r.to_dict() for r in records]})
            assert posted.json() == {"accepted": len(records), "duplicates": 0}
            assert (await api.post("/v1/controller/run")).json()["ran"] is True
            response = await api.get("/metrics")
            assert response.status_code == 200
            return _samples(response.text)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The series names a real app on SQLite exports, and a gateway's ``/metrics`` (the
    ``hedgerow_gateway_*`` family), ``_bucket``/``_sum``/``_count`` stripped."""
    import asyncio

    from hedgerow.gateway._metrics import GatewayMetrics
    from tests.conftest import make_call

    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('monitoring') / 'hedgerow.db'}"
    samples = asyncio.run(_scrape(url, make_call))
    # the gateway's own family, as a gateway's /metrics serves it after one answered request
    gateway = GatewayMetrics()
    gateway.observe("route", "model", "ok", 200, 0.01, 0.02)
    samples.update(_samples(gateway.render().decode()))
    return {_base(name) for name in samples}


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_metric_names_finds_the_series_and_only_them() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(x_bucket{route=~"$route",a="b c"}[$__rate_interval])))'
        " / on (route, model) group_left max by (route) (budget) > 0.1 and time() - y offset 5m"
    )
    assert metric_names(expr) == {"x_bucket", "budget", "y"}
    assert metric_names("label_values(hedgerow_calls_total, route)") == {"hedgerow_calls_total", "route"}


async def test_the_route_budget_is_exported_per_route(database_url: str, call_factory: Any) -> None:
    samples = await _scrape(database_url, call_factory)
    budgets = {(labels["route"], labels["model"]): v for labels, v in samples["hedgerow_route_budget"]}
    assert budgets == {("r", "m1"): 0.05, ("chat", "m1"): 0.10}


def test_the_dashboard_queries_only_exported_series(exported: set[str]) -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 39
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    used: set[str] = set()
    for expr in _dashboard_exprs(dashboard):
        # label_values(metric, label): the second argument is a label, not a series
        expr = re.sub(r"label_values\(\s*([\w:]+)\s*,\s*\w+\s*\)", r"label_values(\1)", expr)
        names = {_base(n) for n in metric_names(expr)}
        assert names, expr
        assert names <= exported, f"{sorted(names - exported)} not exported; query: {expr}"
        used |= names
    wanted = {
        "hedgerow_calls_total", "hedgerow_hedges_total", "hedgerow_route_budget", "hedgerow_hedge_after_seconds",
        "gen_ai_client_operation_time_to_first_chunk_seconds", "hedgerow_hedge_wins_total",
        "hedgerow_controller_last_success_timestamp_seconds", "hedgerow_store_up", "hedgerow_lease_held",
    }  # fmt: skip
    wanted |= {  # the per-upstream panels
        "hedgerow_upstream_ttft_seconds", "hedgerow_upstream_failures_total", "hedgerow_upstream_attempts_total",
        "hedgerow_upstream_races_total", "hedgerow_upstream_hedges_caused_total",
        "hedgerow_upstream_loser_tokens_total",
    }  # fmt: skip
    assert wanted <= used


def test_the_alert_rules_query_only_exported_series(exported: set[str]) -> None:
    rules = _alert_rules()
    assert {r["alert"] for r in rules} == {
        "HedgerowHedgeRateOverBudget", "HedgerowHedgesNotHelping", "HedgerowCallFailuresSurging",
        "HedgerowStoreDown", "HedgerowControllerTickLate", "HedgerowNoLeaseHolder",
        "HedgerowUpstreamFailuresSurging",
    }  # fmt: skip
    for rule in rules:
        names = {_base(n) for n in metric_names(rule["expr"])}
        assert names and names <= exported, f"{rule['alert']}: {sorted(names - exported)} not exported"
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        if "route" in rule["expr"]:  # a per-route alert names the route and the model
            for key in ("summary", "description"):
                assert "$labels.route" in annotations[key] and "$labels.model" in annotations[key], rule["alert"]


def test_every_alert_has_a_promtool_case_where_it_fires_and_one_where_it_does_not() -> None:
    """The promtool unit tests (run by .ci/run) drive each rule's condition: for every alert at
    least one case expects it firing and one expects it silent (or a series that must not fire it)."""
    cases = yaml.safe_load((MONITORING / "hedgerow-alerts.test.yml").read_text())["tests"]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    alerts = {r["alert"] for r in _alert_rules()}
    assert firing == alerts
    assert {"HedgerowUpstreamFailuresSurging", "HedgerowCallFailuresSurging"} <= silent


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian: prometheus)")
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each panel query, Grafana's variables given values, as an alert expression promtool checks."""
    dashboard = _dashboard()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rules = [
        {"alert": f"Panel{i}", "expr": e.replace("$__rate_interval", "5m").replace("$route", ".*")}
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

"""The monitoring kit in monitoring/: Prometheus alert rules and a Grafana dashboard.

- promtool loads the rules (`promtool check rules`) and runs their unit tests
  (`promtool test rules`), and parses every query of the dashboard;
- every metric the rules and the dashboard name is one the services export: the real
  publisher and sink are served on loopback, fed one order, and scraped;
- the dashboard has the structure Grafana imports (a JSON Schema below).

promtool comes from Debian's prometheus package (`make promtool` unpacks it under
.venv/promtool). Where it is missing these tests skip, unless CI or
OUTBOX_REQUIRE_PROMTOOL is set: then they fail. The last tests feed a broken copy of
each file to the same checks, so that a check that passes everything is caught.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import jsonschema
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import POLL_S, WAIT_S, post_json

from publisher.app import ServiceSettings
from publisher.app import create_app as create_publisher
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from sink import create_app as create_sink

if TYPE_CHECKING:
    from conftest import Serve

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "monitoring" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "outbox-relay.json"
VENV_PROMTOOL = ROOT / ".venv" / "promtool" / "usr" / "bin" / "promtool"
PROMTOOL_TIMEOUT_S = 30.0

# Series Prometheus writes itself for each target, not the services.
PROMETHEUS_OWN = frozenset({"up"})
# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})
SEVERITIES = frozenset({"critical", "warning", "info"})


# ---------------------------------------------------------------- promtool


def find_promtool() -> str | None:
    on_path = shutil.which("promtool")
    if on_path is not None:
        return on_path
    return str(VENV_PROMTOOL) if os.access(VENV_PROMTOOL, os.X_OK) else None


@pytest.fixture(scope="module")
def promtool() -> str:
    found = find_promtool()
    if found is not None:
        return found
    message = (
        "promtool is not installed (neither on PATH nor at .venv/promtool/usr/bin/promtool):"
        " `make promtool` unpacks it from Debian's prometheus package"
    )
    if os.environ.get("CI") or os.environ.get("OUTBOX_REQUIRE_PROMTOOL"):
        pytest.fail(f"{message}; CI or OUTBOX_REQUIRE_PROMTOOL requires it")
    pytest.skip(message)


def run_promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )


def test_promtool_loads_the_rules(promtool: str) -> None:
    checked = run_promtool(promtool, "check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts_of(RULES.read_text()))} rules found" in checked.stdout


def test_the_rules_pass_their_unit_tests(promtool: str) -> None:
    tested = run_promtool(promtool, "test", "rules", RULE_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_unit_tests_cover_firing_and_quiet_cases() -> None:
    """Each alert tested is seen both firing and not firing."""
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert len(fired) >= 10, fired
    assert fired == quiet, fired ^ quiet
    assert fired <= {rule["alert"] for rule in alerts_of(RULES.read_text())}


def test_promtool_parses_the_dashboard_queries(promtool: str, tmp_path: Path) -> None:
    """Each query of the dashboard, as a recording rule (Grafana's variables replaced
    by values), passes promtool's parser."""
    rules = [
        {"record": f"dashboard:query_{n}", "expr": grafana_free(expr)}
        for n, expr in enumerate(dashboard_queries(load_dashboard()))
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run_promtool(promtool, "check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def grafana_free(expr: str) -> str:
    """`expr` with Grafana's variables replaced (a range by 5m, any other by a value),
    and label_values(SELECTOR, LABEL) by its selector."""
    expr = re.sub(r"^label_values\((.*),\s*\w+\s*\)$", r"\1", expr)
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?\w+\}?", "all", expr)


# ---------------------------------------------------------------- the rules' shape


def alerts_of(text: str) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


# A Prometheus 2.x rule file, as far as these rules use it; checked with or without
# promtool. Each alert must say how long (for), how bad (severity) and what to do.
DURATION = r"^([0-9]+(ms|s|m|h|d|w|y))+$"
RULES_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["groups"],
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": {"type": "string", "pattern": DURATION},
                    "rules": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/alert"}},
                },
            },
        }
    },
    "$defs": {
        "alert": {
            "type": "object",
            "required": ["alert", "expr", "for", "labels", "annotations"],
            "additionalProperties": False,
            "properties": {
                "alert": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$"},
                "expr": {"type": "string", "minLength": 1},
                "for": {"type": "string", "pattern": DURATION},
                "keep_firing_for": {"type": "string", "pattern": DURATION},
                "labels": {
                    "type": "object",
                    "required": ["severity"],
                    "properties": {"severity": {"enum": sorted(SEVERITIES)}},
                    "additionalProperties": {"type": "string"},
                },
                "annotations": {
                    "type": "object",
                    "required": ["summary", "description"],
                    "properties": {
                        "summary": {"type": "string", "minLength": 10},
                        "description": {"type": "string", "minLength": 80},
                    },
                    "additionalProperties": {"type": "string"},
                },
            },
        }
    },
}


def rules_errors(text: str) -> list[str]:
    """What the schema finds wrong with a rule file, and alert names used twice."""
    document = yaml.safe_load(text)
    validator = jsonschema.Draft202012Validator(RULES_SCHEMA)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]
    if not errors:
        names = [rule["alert"] for rule in alerts_of(text)]
        errors += [f"{name} twice" for name in sorted(set(names)) if names.count(name) > 1]
    return errors


def test_every_alert_says_how_long_how_bad_and_what_to_do() -> None:
    assert rules_errors(RULES.read_text()) == []
    for rule in alerts_of(RULES.read_text()):  # a command to run, or a page to read
        description = rule["annotations"]["description"]
        assert "`outbox-" in description or "/readyz" in description or "--" in description, rule[
            "alert"
        ]


# ---------------------------------------------------------------- metric names


# PromQL words that are neither metrics nor labels; functions are told by their "(".
KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
    | {"unless", "offset", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(\s*\()?")


@dataclass(frozen=True)
class Selector:
    """A metric a query names, and the label matchers it gives it."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...] = ()


def selectors_of(expr: str) -> list[Selector]:
    """The metrics a PromQL expression (or Grafana's label_values(...)) selects, each
    with its matchers: `name{label op "value", ...}`."""
    expr = re.sub(r"label_values\(\s*", "(", expr)  # its first argument is a selector
    found: list[Selector] = []
    for match in re.finditer(r"([a-zA-Z_:][\w:]*)\s*(\{[^{}]*\})", expr):
        found.append(Selector(match.group(1), tuple(_MATCHER.findall(match.group(2)))))
    bare = _MATCHERS.sub(" ", expr)
    bare = _STRING.sub(" ", _GROUPING.sub(" ", _RANGE.sub(" ", _VARIABLE.sub(" ", bare))))
    bare = re.sub(r",\s*[a-zA-Z_]\w*\s*\)", ")", bare)  # label_values' label argument
    for match in _NAME.finditer(bare):
        name, call = match.groups()
        if call is None and name not in KEYWORDS:
            if not any(s.metric == name for s in found):
                found.append(Selector(name))
    return found


@dataclass
class Exposed:
    """What the services' /metrics show: sample names, and label values by name."""

    names: set[str] = field(default_factory=set)
    labels: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def add(self, text: str) -> None:
        for family in text_string_to_metric_families(text):
            self.names |= sample_names(family.name, family.type)
            for sample in family.samples:
                self.names.add(sample.name)
                values = self.labels.setdefault(sample.name, {})
                for label, value in sample.labels.items():
                    values.setdefault(label, set()).add(value)

    def problems(self, queries: list[str]) -> list[str]:
        """Each metric the queries name that no service exports, and each label value
        they ask for equality with that no sample carries."""
        found: list[str] = []
        for expr in queries:
            for selector in selectors_of(expr):
                found.extend(self._problems_of(selector, expr))
        return found

    def _problems_of(self, selector: Selector, expr: str) -> Iterator[str]:
        if selector.metric in PROMETHEUS_OWN:
            return
        if selector.metric not in self.names:
            yield f"{selector.metric} is exported by neither service (in {expr!r})"
            return
        known = self.labels.get(selector.metric, {})
        for label, op, value in selector.matchers:
            if label in TARGET_LABELS:
                continue
            if label not in known:
                yield f"{selector.metric} has no label {label!r} (in {expr!r})"
            elif op in ("=", "=~") and "$" not in value:
                wanted = value.split("|") if op == "=~" else [value]
                for one in wanted:
                    if one not in known[label]:
                        yield f"{selector.metric} has no {label}={one!r} (in {expr!r})"


def sample_names(name: str, kind: str) -> set[str]:
    """The sample names prometheus_client exposes for a family: a counter's with
    _total (and _created), a histogram's _bucket, _sum and _count."""
    if kind == "counter":
        return {f"{name}_total", f"{name}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    return {name}


def rule_queries(text: str) -> list[str]:
    return [rule["expr"] for rule in alerts_of(text)]


def load_dashboard(text: str | None = None) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text() if text is None else text)
    return loaded


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every panel target's expr and every query variable's query."""
    queries = [
        target["expr"]
        for panel in all_panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


@pytest.fixture
async def exposed(serve: Serve, client: aiohttp.ClientSession, tmp_path: Path) -> Exposed:
    """Both services' /metrics after one order was accepted and delivered, so that the
    series by type have a sample too."""
    sink = await serve(create_sink(tmp_path / "sink.db"))
    settings = ServiceSettings(
        db=str(tmp_path / "source.db"),
        sink=f"{sink}/events",
        relay=RelaySettings(poll_interval_s=0.1, retry=RetryPolicy(base_s=0.05, cap_s=0.3)),
    )
    publisher = await serve(create_publisher(settings))
    status, reply = await post_json(
        client, f"{publisher}/orders", {"id": "order-1", "sku": "snack", "qty": 1}
    )
    assert status == 201, reply
    found = Exposed()
    found.add(await delivered_metrics(client, publisher))
    async with client.get(f"{sink}/metrics") as response:
        assert response.status == 200
        found.add(await response.text())
    assert "publisher_ready" in found.names and "sink_ready" in found.names
    return found


async def delivered_metrics(client: aiohttp.ClientSession, base: str) -> str:
    """The publisher's /metrics once they count the order delivered."""
    deadline = time.monotonic() + WAIT_S
    while True:
        async with client.get(f"{base}/metrics") as response:
            assert response.status == 200
            text = await response.text()
        if 'publisher_events_delivered_total{type="order.placed"} 1.0' in text:
            return text
        assert time.monotonic() < deadline, "the order was not delivered in time"
        await asyncio.sleep(POLL_S)


def test_every_metric_of_the_rules_is_exported(exposed: Exposed) -> None:
    assert exposed.problems(rule_queries(RULES.read_text())) == []


def test_every_metric_of_the_dashboard_is_exported(exposed: Exposed) -> None:
    assert exposed.problems(dashboard_queries(load_dashboard())) == []


def test_the_parser_finds_the_metrics_named() -> None:
    """The parser finds what the files name (an empty list would pass anything)."""
    in_rules = {s.metric for q in rule_queries(RULES.read_text()) for s in selectors_of(q)}
    in_dashboard = {s.metric for q in dashboard_queries(load_dashboard()) for s in selectors_of(q)}
    for name in ("publisher_ready", "sink_ready", "publisher_fenced_gaps_crossed_total"):
        assert name in in_rules and name in in_dashboard
    assert "publisher_outbox_head_blocked" in in_rules
    assert "publisher_lines_owned" in in_dashboard
    assert not any(name in KEYWORDS or name == "job" for name in in_rules | in_dashboard)


# ---------------------------------------------------------------- the dashboard's shape

# What Grafana needs of an imported dashboard (the classic JSON model): a uid and a
# title, a schemaVersion it can migrate from, template variables, and panels whose
# queries are Prometheus expressions on the chosen data source.
TARGET_SCHEMA = {
    "type": "object",
    "required": ["refId", "expr"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "datasource": {"$ref": "#/$defs/datasource"},
    },
}
DASHBOARD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "id": {"type": "null"},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 39},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {"$ref": "#/$defs/variable"},
                    "contains": {
                        "type": "object",
                        "required": ["name", "type", "query"],
                        "properties": {
                            "name": {"const": "datasource"},
                            "type": {"const": "datasource"},
                            "query": {"const": "prometheus"},
                        },
                    },
                }
            },
        },
        "panels": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/panel"}},
    },
    "$defs": {
        "datasource": {
            "type": "object",
            "required": ["type", "uid"],
            "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
        },
        "gridPos": {
            "type": "object",
            "required": ["h", "w", "x", "y"],
            "properties": {
                "h": {"type": "integer", "minimum": 1},
                "w": {"type": "integer", "minimum": 1, "maximum": 24},
                "x": {"type": "integer", "minimum": 0, "maximum": 23},
                "y": {"type": "integer", "minimum": 0},
            },
        },
        "variable": {
            "type": "object",
            "required": ["name", "type"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                "type": {"enum": ["datasource", "query", "custom", "constant", "interval"]},
            },
            "if": {"properties": {"type": {"const": "query"}}},
            "then": {
                "required": ["datasource", "query"],
                "properties": {
                    "datasource": {"$ref": "#/$defs/datasource"},
                    "query": {
                        "type": "object",
                        "required": ["query"],
                        "properties": {"query": {"type": "string", "minLength": 1}},
                    },
                },
            },
        },
        "panel": {
            "type": "object",
            "required": ["id", "type", "title", "gridPos"],
            "properties": {
                "id": {"type": "integer"},
                "type": {"type": "string"},
                "title": {"type": "string", "minLength": 1},
                "gridPos": {"$ref": "#/$defs/gridPos"},
            },
            "if": {"properties": {"type": {"const": "row"}}},
            "then": {"properties": {"panels": {"type": "array"}}},
            "else": {
                "required": ["datasource", "targets"],
                "properties": {
                    "type": {"enum": ["timeseries", "stat", "gauge", "bargauge", "table"]},
                    "datasource": {"$ref": "#/$defs/datasource"},
                    "targets": {"type": "array", "minItems": 1, "items": TARGET_SCHEMA},
                },
            },
        },
    },
}


def dashboard_errors(dashboard: dict[str, Any]) -> list[str]:
    """What the schema finds wrong, and what it cannot say: panel IDs and each panel's
    refIds unique, no panel past the grid's 24 columns."""
    validator = jsonschema.Draft202012Validator(DASHBOARD_SCHEMA)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(dashboard)]
    if errors:
        return errors
    panels = list(all_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    if len(ids) != len(set(ids)):
        errors.append(f"panel ids repeat: {ids}")
    for panel in panels:
        if panel["gridPos"]["x"] + panel["gridPos"]["w"] > 24:
            errors.append(f"{panel['title']!r} is wider than the grid")
        refs = [target["refId"] for target in panel.get("targets", [])]
        if len(refs) != len(set(refs)):
            errors.append(f"{panel['title']!r} repeats a refId")
    return errors


def test_the_dashboard_has_what_grafana_imports() -> None:
    dashboard = load_dashboard()
    assert dashboard_errors(dashboard) == []
    names = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= names


# ---------------------------------------------------------------- the checks can fail


def test_a_misspelt_metric_is_caught(exposed: Exposed) -> None:
    def unknown(problems: list[str]) -> list[str]:
        return [problem.split(" ")[0] for problem in problems]

    rules = RULES.read_text().replace(
        "publisher_outbox_head_blocked", "publisher_outbox_head_blockd"
    )
    assert unknown(exposed.problems(rule_queries(rules))) == ["publisher_outbox_head_blockd"]
    text = DASHBOARD.read_text().replace("sink_inbox_events{", "sink_inbox_event{")
    assert unknown(exposed.problems(dashboard_queries(load_dashboard(text)))) == [
        "sink_inbox_event"
    ]
    # A counter named without _total; a label value no sample has (at the intake and
    # at the sink); a label the metric does not have.
    bare = RULES.read_text().replace("sink_fenced_requests_total", "sink_fenced_requests")
    assert unknown(exposed.problems(rule_queries(bare))) == ["sink_fenced_requests"]
    wrong = RULES.read_text().replace('result="conflict"}', 'result="conflicts"}')
    assert unknown(exposed.problems(rule_queries(wrong))) == [
        "publisher_intake_total",
        "sink_inbox_received_total",
    ]
    label = RULES.read_text().replace('{outcome="permanent"}', '{result="permanent"}')
    assert exposed.problems(rule_queries(label)) == [
        "publisher_delivery_attempts_total has no label 'result' (in"
        " 'increase(publisher_delivery_attempts_total{result=\"permanent\"}[10m]) > 0')"
    ]


def test_a_rule_without_for_or_severity_is_caught() -> None:
    text = RULES.read_text()
    assert rules_errors(text.replace("        for: 10m\n", "", 1)) == [
        "['groups', 1, 'rules', 1]: 'for' is a required property"
    ]
    assert len(rules_errors(text.replace("severity: info", "severity: page"))) == 1
    twice = text.replace("alert: OutboxSinkFenced", "alert: OutboxPublisherFenced")
    assert rules_errors(twice) == ["OutboxPublisherFenced twice"]


def test_a_broken_dashboard_is_caught() -> None:
    dashboard = load_dashboard()
    del dashboard["panels"][1]["targets"][0]["expr"]
    dashboard["templating"]["list"] = dashboard["templating"]["list"][1:]
    errors = dashboard_errors(dashboard)
    assert any("'expr' is a required property" in error for error in errors), errors
    assert any("templating" in error for error in errors), errors


def test_promtool_catches_a_broken_copy(promtool: str, tmp_path: Path) -> None:
    """A rule that does not parse, and a unit test whose alert does not fire as said."""
    broken = tmp_path / "alerts.yml"
    broken.write_text(RULES.read_text().replace("publisher_ready == 0", "publisher_ready == = 0"))
    assert run_promtool(promtool, "check", "rules", broken).returncode != 0
    shutil.copy(RULES, tmp_path / "alerts.yml")
    tests = RULE_TESTS.read_text().replace("values: 1 1 0x10", "values: 1x12", 1)
    (tmp_path / "alerts_test.yml").write_text(tests)
    failed = run_promtool(promtool, "test", "rules", tmp_path / "alerts_test.yml")
    assert failed.returncode != 0, failed.stdout

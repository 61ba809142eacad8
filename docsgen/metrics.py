"""docs/reference/metrics.md: every metric of both services, read from the registry
of each service's real application (built, never started: no file is opened)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from docsgen.markdown import GENERATED_NOTE, code, page, table, text
from plumbing.capped_labels import MAX_TYPE_LABELS, OTHER_TYPES

INTRO: Final = f"""
# Metrics

Each service serves its metrics in the Prometheus text format at `GET /metrics`, open
without a token, from a registry of its own (no process or platform collectors). A
scrape first checks the database as `GET /readyz` does (which sets the `_ready` gauge)
and reads the gauges that describe the database (the backlog, the inbox's size) at
that moment; the counters are kept in the process and start at 0 when it starts.

Names are listed as a scrape shows them: a counter `NAME_total`, with the companion
series `NAME_created` (when the series began, in Unix seconds) that the Prometheus
client adds to each counter. Labels whose values are known in advance have a series
for each from the start, at 0, so that a rate over them is defined before the first
event.

**Per-type counters are capped.** Event types are their producers' to choose, so the
counters labelled `type` keep a series for each of the first {MAX_TYPE_LABELS} types a process
counts; every later type counts under `type="{OTHER_TYPES}"`, which no event type can
be (parentheses are not allowed in a type). A restart starts the count of types again.

Alert rules and a dashboard built on these metrics are in
[Monitor with Prometheus](../how-to/monitor.md).
"""


# What a metric's help does not say, written by hand (a test checks that each names a
# metric of the registries).
NOTES: Final[dict[str, str]] = {
    "publisher_intake_total": "It counts events (`POST /events`, `POST /events/batch`)"
    " as well as orders. Two more `result` values appear when they first happen:"
    " `unauthorized` (a missing or wrong intake token) and `timeout` (a body that did"
    " not arrive in time).",
}


@dataclass(frozen=True)
class Metric:
    name: str  # as a scrape shows it
    kind: str
    labels: tuple[str, ...]
    help: str
    initial: tuple[str, ...]  # label values with a series from the start


def publisher_registry(directory: Path) -> CollectorRegistry:
    """The registry of `outbox-publisher serve`'s application, the gauges it adds
    included (the database is not opened until the application starts)."""
    from publisher.app import METRICS, ServiceSettings, create_app
    from publisher.settings import RelaySettings, WorkerSettings

    settings = ServiceSettings(
        db=str(directory / "outbox.db"),
        sink="http://127.0.0.1:8080/events",
        relay=RelaySettings(worker=WorkerSettings("docsgen")),
    )
    return create_app(settings)[METRICS].registry


def sink_registry(directory: Path) -> CollectorRegistry:
    """The registry of `outbox-sink`'s application."""
    from sink.app import METRICS, create_app

    return create_app(str(directory / "inbox.db"))[METRICS].registry


def metrics_of(registry: CollectorRegistry) -> list[Metric]:
    """Every metric of `registry`, in the order the service registers them."""
    found = []
    for collector in registry._collector_to_names:
        if not hasattr(collector, "_name"):  # a collector of our own: read its families
            found.extend(_families_of(collector))
            continue
        name = collector._name
        kind = collector._type  # type: ignore[attr-defined]
        labels = tuple(collector._labelnames)  # type: ignore[attr-defined]
        initial: list[str] = []
        for family in collector.collect():
            for sample in family.samples:
                if sample.labels and not sample.name.endswith("_created"):
                    initial.append(",".join(f'{k}="{v}"' for k, v in sample.labels.items()))
        found.append(
            Metric(
                name=f"{name}_total" if kind == "counter" else name,
                kind=kind,
                labels=labels,
                help=collector._documentation,  # type: ignore[attr-defined]
                initial=tuple(initial),
            )
        )
    return found


def _families_of(collector: Collector) -> list[Metric]:
    """The metrics a collector that is not one metric (prometheus_client's GCCollector)
    yields."""
    found = []
    for family in collector.collect():
        labelled = [sample.labels for sample in family.samples if sample.labels]
        found.append(
            Metric(
                name=f"{family.name}_total" if family.type == "counter" else family.name,
                kind=family.type,
                labels=tuple(labelled[0]) if labelled else (),
                help=family.documentation,
                initial=tuple(",".join(f'{k}="{v}"' for k, v in one.items()) for one in labelled),
            )
        )
    return found


def _sentence(help_text: str) -> str:
    """A metric's help as a sentence (prometheus_client's own end without a period)."""
    return help_text if help_text.endswith(".") else help_text + "."


def service_metrics() -> dict[str, list[Metric]]:
    """Both services' metrics, by program."""
    with tempfile.TemporaryDirectory(prefix="docsgen-") as directory:
        where = Path(directory)
        return {
            "outbox-publisher serve": metrics_of(publisher_registry(where)),
            "outbox-sink": metrics_of(sink_registry(where)),
        }


def render() -> str:
    sections = []
    for program, metrics in service_metrics().items():
        rows = [
            [
                code(m.name),
                m.kind,
                ", ".join(code(label) for label in m.labels) or "none",
                text(_sentence(m.help))
                + (" " + NOTES[m.name] if m.name in NOTES else "")
                + (
                    " Series from the start: " + ", ".join(code(s) for s in m.initial) + "."
                    if m.initial
                    else ""
                ),
            ]
            for m in metrics
        ]
        sections.append(
            f"## {code(program)}\n\n" + table(["Metric", "Type", "Labels", "Help"], rows)
        )
    return page(GENERATED_NOTE, INTRO, *sections)

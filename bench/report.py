"""The printed report: a line of figures per case, then a line per target.

Each case has its describe function in `DESCRIBE`: its own figures in a line, with
the ratios to the references of the same run that make them readable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from bench import generic, workers
from bench.cases import Figures
from bench.events import Kind
from bench.own_handler import Registry
from bench.targets import Results, Target, fig, figure, ratio

Describe = Callable[[Figures, Results], str]


def render(report: dict[str, Any], targets: list[Target]) -> str:
    results: Results = report["cases"]
    machine = report["machine"]
    postgresql = f", PostgreSQL {machine['postgresql']}" if machine.get("postgresql") else ""
    lines = [
        f"outbox relay benchmark, {report['mode']} mode"
        f"{' (profiled: rates not comparable)' if report.get('profiled') else ''}, "
        f"{report['duration_s']:.0f}s: "
        f"{machine['cpus_usable']} CPUs, Python {machine['python']}, SQLite {machine['sqlite']}"
        f"{postgresql}, "
        f"load {machine['load_average_start'][0]:.2f} -> {machine['load_average_end'][0]:.2f}",
        "",
        f"{'case':<22} figures",
    ]
    for name, figures in results.items():
        if "error" in figures:
            text = f"FAILED: {figures['error']}"
        elif figures.get("available") is False:
            text = f"not available: {figures.get('reason')}"
        else:
            text = describe(name, figures, results)
        lines.append(f"{name:<22} {text}")
        for process, seen in figures.get("profile", {}).items():
            lines.append(f"{'':<22}   {_profiled(process, seen, figures)}")
    lines += ["", f"{'target':<52} {'measured':>10} {'target':>10}  result"]
    for t in targets:
        lines += _target_lines(t)
    return "\n".join(lines)


def _target_lines(t: Target) -> list[str]:
    measured = "-" if t.measured is None else f"{t.measured:.2f}{t.unit}"
    goal = f"{t.comparison} {t.target:g}{t.unit}"
    result = {True: "met", False: "missed", None: "not measured"}[t.met]
    if t.reference:
        result = "reference" if t.measured is not None else "not measured"
    if t.met is False and t.reach is not None and t.reach < t.target:
        result += f": out of reach, its CPU per event allows {t.reach:.2f}{t.unit} here"
    return [
        f"{t.name:<52} {measured:>10} {goal:>10}  {result}",
        f"    {t.detail}" + (f" ({t.why_not})" if t.why_not else ""),
    ]


def _profiled(process: str, seen: Figures, figures: Figures) -> str:
    """One line of a --profile summary: a process's areas, or the server's statements
    (a generic-event case names each by process and kind: "postgres (generic)")."""
    if process.partition(" ")[0] != "postgres":
        areas = ", ".join(f"{a} {share:.0%}" for a, share in list(seen["areas"].items())[:8])
        return f"py-spy {process} ({seen['samples']:,} samples): {areas}"
    total = seen["statement_ms"]
    timed = [(q, q["exec_ms"] + q["plan_ms"]) for q in seen["top_statements"][:3]]
    top = ", ".join(
        f"{q['database']} {ms / total:.0%} (plan {q['plan_ms'] / ms:.0%}) {q['query'][:40]}..."
        for q, ms in timed
        if ms > 0
    )
    orders = figures.get("orders") or figures["events_per_round"]
    return (
        f"pg_stat_statements{process.removeprefix('postgres')}: "
        f"{total / orders:.3f} ms in statements per order "
        f"({seen['calls']:,} calls)" + (f"; {top}" if top else "")
    )


def describe(name: str, figures: Figures, results: Results) -> str:
    """The line of figures of one case that ran (JSON for a case without a describe)."""
    how = DESCRIBE.get(name)
    return json.dumps(figures) if how is None else how(figures, results)


# ---------------------------------------------------------------- helpers


def _x(a: float | None, b: float | None) -> str:
    r = ratio(a, b)
    return "?" if r is None else f"{r:.2f}x"


def _of(results: Results, case: str, key: str) -> float | None:
    return figure(results, fig(case, key))


def _breakdown(f: Figures) -> str:
    return (
        f"per event {f['ms_per_event']:.3f} ms = {f['ms_per_event_in_requests']:.3f} in "
        f"requests + {f['ms_per_event_elsewhere']:.3f} elsewhere"
    )


def _drained(f: Figures, flight: str) -> str:
    return f"{f['events_per_s']:,.0f} events/s (backlog {f['backlog']:,}, {flight})"


def _waits(w: Figures) -> str:
    return f"p50 {w['p50_ms']:.1f} / p99 {w['p99_ms']:.1f} / max {w['max_ms']:.1f} ms"


# ---------------------------------------------------------------- one per case


def _ceiling(f: Figures, results: Results) -> str:
    return (
        f"{f['round_trips_per_s']:,.0f} round trips/s ({f['requests']:,} sequential); "
        f"batches of 16 to the same server: {f['batch_events_per_s']:,.0f} events/s"
    )


def _commit_ceiling(f: Figures, results: Results) -> str:
    return f"{f['commits_per_s']:,.0f} durable commits/s ({f['commits']:,})"


def _pg_commit_ceiling(f: Figures, results: Results) -> str:
    settings = f.get("settings") or {}
    return (
        f"{f['commits_per_s']:,.0f} durable commits/s ({f['commits']:,}; fsync "
        f"{settings.get('fsync')}, synchronous_commit {settings.get('synchronous_commit')}, "
        f"{settings.get('wal_sync_method')})"
    )


def _naive_peer(f: Figures, results: Results) -> str:
    return f"{f['events_per_s']:,.0f} events/s (backlog {f['backlog']:,})"


def _relay_single(f: Figures, results: Results) -> str:
    ceiling = _of(results, "ceiling", "round_trips_per_s")
    naive = _of(results, "naive_peer", "events_per_s")
    flight = f"up to {f['pipeline']} in flight"
    return (
        f"{_drained(f, flight)} = "
        f"{_x(f['events_per_s'], ceiling)} ceiling, {_x(f['events_per_s'], naive)} naive peer"
    )


def _relay_batch(f: Figures, results: Results) -> str:
    ceiling = _of(results, "ceiling", "round_trips_per_s")
    flight = f"up to {f['pipeline']} in flight"
    return f"{_drained(f, flight)} = {_x(f['events_per_s'], ceiling)} ceiling"


def _relay_serial(f: Figures, results: Results) -> str:
    ceiling = _of(results, "ceiling", "round_trips_per_s")
    return (
        f"{_drained(f, 'one request in flight')} = {_x(f['events_per_s'], ceiling)} ceiling; "
        + _breakdown(f)
    )


def _pg_relay(sqlite_case: str, f: Figures, results: Results) -> str:
    """A pg_relay_* case, against the commit ceilings and its SQLite twin."""
    ceiling = _of(results, "ceiling", "round_trips_per_s")
    pg_commits = _of(results, "pg_commit_ceiling", "commits_per_s")
    sqlite = _of(results, sqlite_case, "events_per_s")
    flight = f"up to {f['pipeline']} in flight" if f["pipeline"] > 1 else "one in flight"
    return (
        f"{_drained(f, flight)} = "
        f"{_x(f['events_per_s'], ceiling)} ceiling, {_x(f['events_per_s'], pg_commits)} "
        f"PostgreSQL commit ceiling, {_x(f['events_per_s'], sqlite)} SQLite"
        + ("; " + _breakdown(f) if f["pipeline"] == 1 else "")
    )


def _pg_workers(f: Figures, results: Results) -> str:
    rates = ", ".join(f"{k} workers {f[f'events_per_s_{k}']:,.0f}" for k in workers.WORKER_COUNTS)
    cpu = ", ".join(
        f"{f.get(f'cpu_s_per_1k_workers_{k}', math.nan):.2f}"
        f" + {f.get(f'cpu_s_per_1k_sink_{k}', math.nan):.2f}"
        for k in workers.WORKER_COUNTS
    )
    return (
        f"{rates} events/s (2 x {f['backlog_per_run']:,} each, {f['skus']} SKUs, 5 ms "
        f"sink, one per request); CPU s per 1,000 (workers + sink) {cpu}; "
        f"{f['duplicates']} duplicates; failover "
        f"{f['failover_s']:.2f} s (lease TTL {f['lease_ttl_s']:g} s)"
    )


def _relay_lanes(f: Figures, results: Results) -> str:
    parts = []
    for delivery, label in (("single", "one/request"), ("batch", "batches")):
        for suffix, depth in (("", "one in flight"), ("_pipelined", "pipelined")):
            g = f[f"{delivery}_global{suffix}_events_per_s"]
            lane = f[f"{delivery}_lanes{suffix}_events_per_s"]
            parts.append(
                f"{label}, {depth}: global {g:,.0f}, lanes {lane:,.0f} events/s = {_x(lane, g)}"
            )
    runs = f"{f['runs_per_mode']} x {f['backlog_per_run']:,} per mode"
    return f"{runs}, 5 ms sink, 8 SKUs; " + "; ".join(parts)


def _intake_latency(f: Figures, results: Results) -> str:
    idle, stalled = f["idle"], f["stalled"]
    return (
        f"healthy sink p50 {idle['p50_ms']:.1f} / p99 {idle['p99_ms']:.1f} ms; "
        f"sink stalled p50 {stalled['p50_ms']:.1f} / p99 {stalled['p99_ms']:.1f} ms "
        f"= {_x(stalled['p99_ms'], idle['p99_ms'])} ({f['requests']} requests each)"
    )


def _scaling(f: Figures, results: Results) -> str:
    small, big = f["sent_rows"]
    few, many = f["lanes_skus"]
    pending, scrape, rates = f["pending16_ms"], f["scrape_ms"], f["events_per_s"]
    backlogs = "/".join(f"{b:,}" for b in f["backlogs"])
    return (
        f"pending(16) {pending[0]:.3f} -> {pending[1]:.3f} ms ({_x(pending[1], pending[0])}), "
        f"scrape {scrape[0]:.3f} -> {scrape[1]:.3f} ms ({_x(scrape[1], scrape[0])}) "
        f"at {small:,} -> {big:,} sent rows; throughput from {backlogs}: "
        + " / ".join(f"{r:,.0f}" for r in rates)
        + f" events/s ({_x(rates[2], rates[0])}); lanes draining "
        + f"{f['lanes_backlog']:,} over {few} / {many:,} SKUs: "
        + f"{f[f'lanes_events_per_s_{few}_skus']:,.0f} / "
        + f"{f[f'lanes_events_per_s_{many}_skus']:,.0f} events/s"
    )


def _memory(f: Figures, results: Results) -> str:
    small, big = f["backlogs"]
    low, high = f["peak_rss_mib"]
    return (
        f"peak RSS {low:.1f} MiB draining {small:,}, {high:.1f} MiB draining {big:,} "
        f"(+{high - low:.1f} MiB)"
    )


# ---------------------------------------------------------------- end to end


def _against(commit_case: str, rate: float, results: Results) -> str:
    """A rate against both e2e ceilings and, once it ran, the backend's commit ceiling
    (intake makes every order durable)."""
    ceilings = [_of(results, "e2e_ceiling", f"round_trips_per_s_{k}") for k in (1, 8)]
    commits = _of(results, commit_case, "commits_per_s")
    text = f"{_x(rate, ceilings[0])} 1-client, {_x(rate, ceilings[1])} 8-client ceiling"
    return text + (f", {_x(rate, commits)} commit ceiling" if commits else "")


def _cpu(f: Figures, results: Results) -> str:
    shares = ", ".join(f"{k} {v:.0%}" for k, v in f["cpu_share"].items())
    text = f"CPU {shares}; {f['cpu_ms_per_order']:.2f} ms CPU per order in all"
    trip = _of(results, "e2e_ceiling", "cpu_ms_per_round_trip_8")
    if trip:  # at the ceiling's CPU use, the ratio to it can reach 1 / this at most
        text += f" = {_x(f['cpu_ms_per_order'], trip)} an 8-client ceiling round trip's"
    bound = f["cpu_bound_per_s"]
    ceiling = _of(results, "e2e_ceiling", "round_trips_per_s_8")
    return text + (
        f", at most {bound:,.0f}/s with all {f['cpus']} CPUs busy "
        f"({_x(bound, ceiling)} 8-client ceiling)"
    )


def _e2e_ceiling(f: Figures, results: Results) -> str:
    used = [
        f"{k} client{'s' if k > 1 else ''} {f[f'cpu_ms_per_round_trip_{k}']:.2f} ms "
        f"({sum(f[f'cpu_share_{k}'].values()):.2f} CPUs busy)"
        for k in (1, 8)
    ]
    return (
        f"trivial handler: 1 client {f['round_trips_per_s_1']:,.0f}, 8 clients "
        f"{f['round_trips_per_s_8']:,.0f} round trips/s ({f['requests']:,} each); "
        f"CPU per round trip, clients and server together: {used[0]}, {used[1]}"
    )


def _e2e_intake(commit_case: str, f: Figures, results: Results) -> str:
    return (
        f"POST /orders alone, sink stopped: {f['orders_per_s']:,.0f} orders/s "
        f"({f['orders']:,}, 8 clients) = {_against(commit_case, f['orders_per_s'], results)}; "
        f"{_cpu(f, results)}"
    )


def _e2e_drain(commit_case: str, how: str, f: Figures, results: Results) -> str:
    return (
        f"{f['events_per_s']:,.0f} events/s until applied and marked ({f['orders']:,} "
        f"orders, {how}, 8 clients; the answers at {f['intake_orders_per_s']:,.0f}/s) = "
        f"{_against(commit_case, f['events_per_s'], results)}; {_cpu(f, results)}"
    )


def _e2e_single(commit_case: str, f: Figures, results: Results) -> str:
    return (
        _e2e_drain(commit_case, "POST /orders", f, results)
        + f"; 201 to applied at this load {_waits(f['latency_at_full_load'])}"
    )


def _e2e_bulk(commit_case: str, f: Figures, results: Results) -> str:
    return _e2e_drain(commit_case, f"POST /orders/batch of {f['batch']}", f, results)


def _e2e_latency(f: Figures, results: Results) -> str:
    return (
        f"at {f['offered_per_s']:,.0f} orders/s offered ({f['orders']:,}): healthy sink "
        f"{_waits(f['idle'])}; sink stopped {f['stall_s']:g} s: {_waits(f['stalled'])}"
    )


# ---------------------------------------------------------------- generic events


def _kinds(f: Figures, key: str = "events_per_s", unit: str = "events/s") -> str:
    """Each kind's figure, the generic ones with their ratio to the orders'."""
    orders = f[f"{key}_{Kind.ORDER}"]
    parts = [f"orders {orders:,.0f}"]
    for kind, label in ((Kind.GENERIC, "1 KiB"), (Kind.FLOATS, "1 KiB with floats")):
        rate = f[f"{key}_{kind}"]
        parts.append(f"{label} {rate:,.0f} ({_x(rate, orders)})")
    return ", ".join(parts) + f" {unit}"


def _relay_generic(f: Figures, results: Results) -> str:
    rounds = f"{f['rounds_per_kind']} x {f['backlog_per_round']:,} per kind"
    return f"{_kinds(f)} ({rounds}, {f['delivery']})"


def _e2e_generic(f: Figures, results: Results) -> str:
    rounds = f"{f['rounds_per_kind']} x {f['events_per_round']:,} per kind"
    cpu = ", ".join(
        f"{label} {f[f'cpu_{kind}']['cpu_ms_per_order']:.2f}"
        for kind, label in zip(generic.KINDS, ("orders", "1 KiB", "1 KiB with floats"), strict=True)
    )
    return (
        f"{_kinds(f)} until applied and marked ({rounds}, {f['route']}, {f['clients']} "
        f"clients); answered at {_kinds(f, 'intake_per_s', 'per s')}; CPU per event in "
        f"all (ms): {cpu}"
    )


# ---------------------------------------------------------------- a handler of one's own


def _registries(f: Figures, key: str = "events_per_s", unit: str = "events/s") -> str:
    """The built-in registry's figure and the own handler's, with their ratio."""
    built_in, own = f[f"{key}_{Registry.BUILT_IN}"], f[f"{key}_{Registry.OWN}"]
    return f"built-in {built_in:,.0f}, own handler {own:,.0f} ({_x(own, built_in)}) {unit}"


def _relay_handler(f: Figures, results: Results) -> str:
    rounds = f"{f['rounds_per_registry']} x {f['backlog_per_round']:,} per registry"
    built_in, own = (
        f[f"cpu_us_per_event_{Registry.BUILT_IN}"],
        f[f"cpu_us_per_event_{Registry.OWN}"],
    )
    cpu = ", ".join(f"{process} {us:.0f} / {own[process]:.0f}" for process, us in built_in.items())
    return f"{_registries(f)} ({rounds}, {f['delivery']}); CPU us per event, built-in / own: {cpu}"


def _e2e_handler(f: Figures, results: Results) -> str:
    rounds = f"{f['rounds_per_registry']} x {f['events_per_round']:,} per registry"
    cpu = " / ".join(f"{f[f'cpu_{r}']['cpu_ms_per_order']:.3f}" for r in Registry)
    return (
        f"{_registries(f)} until applied and marked ({rounds}, {f['route']}, {f['clients']} "
        f"clients); answered at {_registries(f, 'intake_per_s', 'per s')}; CPU per event in "
        f"all, built-in / own: {cpu} ms"
    )


def _event_costs(f: Figures, results: Results) -> str:
    def each(key: str) -> str:
        return " / ".join(f"{f[key][kind]:.1f}" for kind in ("order", "generic", "generic_floats"))

    # Neither is in the results of earlier versions.
    envelope = f"; envelope {each('envelope_read_us')}" if "envelope_read_us" in f else ""
    times = f.get("checked_parsed_dated_us")
    dated = "" if times is None else f"; 1 KiB with text times {times:.1f}"
    schema = f.get("schema_check_us")
    checked = (
        f"Schemas.check ({f['schema_bytes']:,} B schema) {schema['generic']:.1f} / "
        f"{schema['generic_floats']:.1f}"
        if schema
        else f"Schemas.check not timed: {f.get('schema_unavailable')}"
    )
    return (
        f"us per event, order / 1 KiB / 1 KiB with floats: checked_event {each('checked_event_us')}"
        f" (parsed {each('checked_parsed_us')}{dated}), "
        f"canonical_parts {each('canonical_parts_us')}, "
        f"json.loads {each('json_loads_us')} (orjson {each('stored_read_us')}{envelope}), "
        f"loads_strict {each('loads_strict_us')}; "
        f"an order at POST /orders {f['order_intake_us']:.1f}; {checked}"
    )


def _mark_costs(f: Figures, results: Results) -> str:
    sizes = f["event_bytes"]
    names = " / ".join(f"{size:,} B" for size in sizes)
    us = " / ".join(f"{f['mark_us'][str(size)]:.1f}" for size in sizes)
    wal = " / ".join(f"{f['wal_bytes'][str(size)]:,.0f}" for size in sizes)
    return (
        f"per entry marked, events of {names}: {us} us, WAL {wal} bytes ({f['entries']:,} "
        f"entries per size in calls of {f['batch']}, rounds: {f['rounds']}; events of "
        f"{f['apart_chars']:,} characters or more kept apart)"
    )


def _e2e(prefix: str, commit_case: str) -> dict[str, Describe]:
    """The end-to-end cases of one backend, measured against its commit ceiling."""
    return {
        f"{prefix}e2e_intake": partial(_e2e_intake, commit_case),
        f"{prefix}e2e_single": partial(_e2e_single, commit_case),
        f"{prefix}e2e_bulk": partial(_e2e_bulk, commit_case),
        f"{prefix}e2e_latency": _e2e_latency,
        f"{prefix}e2e_single_generic": _e2e_generic,
        f"{prefix}e2e_bulk_generic": _e2e_generic,
        f"{prefix}e2e_bulk_handler": _e2e_handler,
    }


DESCRIBE: Final[dict[str, Describe]] = {
    "ceiling": _ceiling,
    "commit_ceiling": _commit_ceiling,
    "event_costs": _event_costs,
    "mark_costs": _mark_costs,
    "naive_peer": _naive_peer,
    "relay_single": _relay_single,
    "relay_batch": _relay_batch,
    "relay_single_serial": _relay_serial,
    "relay_batch_serial": _relay_serial,
    "relay_lanes": _relay_lanes,
    **{
        f"{prefix}relay_{delivery}_{variant}": describe
        for prefix in ("", "pg_")
        for delivery in ("single", "batch")
        for variant, describe in (("generic", _relay_generic), ("handler", _relay_handler))
    },
    "intake_latency": _intake_latency,
    "e2e_ceiling": _e2e_ceiling,
    **_e2e("", "commit_ceiling"),
    "scaling": _scaling,
    "memory": _memory,
    "pg_commit_ceiling": _pg_commit_ceiling,
    **{
        f"pg_{case}": partial(_pg_relay, case)
        for case in ("relay_single", "relay_batch", "relay_single_serial", "relay_batch_serial")
    },
    "pg_workers": _pg_workers,
    **_e2e("pg_", "pg_commit_ceiling"),
}

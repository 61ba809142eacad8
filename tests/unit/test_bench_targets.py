"""The benchmark's target table and case lines, judged on a recorded run: no process.

RESULTS is a run of every case on a 2-CPU machine (`--quick --backend postgres`),
trimmed to the figures the report reads and rounded (the generic-event and handler
cases' figures, bench.generic and bench.own_handler, are made up to put their rows on
both sides of the goal). Each target below is written out as its figures (numerator /
denominator, from RESULTS) and its goal as the report prints it, so a row that swapped
its figures or changed its goal fails here.
"""

from __future__ import annotations

import copy

import pytest

from bench import workers
from bench.cases import FULL, QUICK, Figures
from bench.report import DESCRIBE, describe, render
from bench.runner import CASES, PG_CASES
from bench.targets import TABLE, Target, evaluate

RESULTS: dict[str, Figures] = {
    "ceiling": {"round_trips_per_s": 1430.0, "requests": 1000, "batch_events_per_s": 17800.0},
    "commit_ceiling": {"commits_per_s": 268.0, "commits": 1000},
    "naive_peer": {"events_per_s": 56.0, "backlog": 1000},
    "relay_single": {"events_per_s": 389.0, "backlog": 1000, "pipeline": 8},
    "relay_batch": {"events_per_s": 2750.0, "backlog": 1000, "pipeline": 8},
    "relay_single_serial": {
        "events_per_s": 160.0,
        "backlog": 1000,
        "pipeline": 1,
        "ms_per_event": 6.27,
        "ms_per_event_in_requests": 5.77,
        "ms_per_event_elsewhere": 0.497,
    },
    "relay_batch_serial": {
        "events_per_s": 1650.0,
        "backlog": 1000,
        "pipeline": 1,
        "ms_per_event": 0.606,
        "ms_per_event_in_requests": 0.535,
        "ms_per_event_elsewhere": 0.0711,
    },
    "relay_lanes": {
        "backlog_per_run": 200,
        "runs_per_mode": 2,
        "single_global_events_per_s": 67.0,
        "single_global_pipelined_events_per_s": 352.0,
        "single_lanes_events_per_s": 251.0,
        "single_lanes_pipelined_events_per_s": 534.0,
        "batch_global_events_per_s": 829.0,
        "batch_global_pipelined_events_per_s": 1860.0,
        "batch_lanes_events_per_s": 1170.0,
        "batch_lanes_pipelined_events_per_s": 1190.0,
    },
    "intake_latency": {
        "requests": 50,
        "idle": {"p50_ms": 4.84, "p99_ms": 20.2, "max_ms": 20.2},
        "stalled": {"p50_ms": 7.42, "p99_ms": 17.5, "max_ms": 17.5},
    },
    "e2e_ceiling": {
        "requests": 200,
        "round_trips_per_s_1": 1290.0,
        "round_trips_per_s_8": 1650.0,
        "cpu_ms_per_round_trip_1": 0.445,
        "cpu_ms_per_round_trip_8": 0.319,
        "cpu_share_1": {"server": 0.257, "client": 0.315},
        "cpu_share_8": {"server": 0.248, "client": 0.28},
    },
    "scaling": {
        "sent_rows": [1000, 100000],
        "backlogs": [500, 2000, 5000],
        "pending16_ms": [0.098, 0.0977],
        "scrape_ms": [0.289, 0.29],
        "events_per_s": [4530.0, 6350.0, 4740.0],
        "lanes_backlog": 800,
        "lanes_skus": [8, 2000],
        "lanes_events_per_s_8_skus": 2810.0,
        "lanes_events_per_s_2000_skus": 328.0,
    },
    "memory": {"backlogs": [1000, 10000], "peak_rss_mib": [46.7, 48.9]},
    "mark_costs": {
        "entries": 512,
        "batch": 128,
        "rounds": 2,
        "apart_chars": 2048,
        "event_bytes": [100, 1024, 8192, 32768],
        "mark_us": {"100": 19.2, "1024": 27.9, "8192": 15.1, "32768": 13.0},
        "wal_bytes": {"100": 130.0, "1024": 1032.0, "8192": 129.0, "32768": 129.0},
    },
    "pg_commit_ceiling": {
        "commits_per_s": 1720.0,
        "commits": 1000,
        "settings": {"fsync": "on", "synchronous_commit": "on", "wal_sync_method": "fdatasync"},
    },
    "pg_workers": {
        "skus": 64,
        "backlog_per_run": 600,
        "duplicates": 0,
        "failover_s": 3.51,
        "failover_bound_s": 4.0,
        "lease_ttl_s": 2.0,
        "events_per_s_1": 387.0,
        "events_per_s_2": 307.0,
        "events_per_s_4": 305.0,
        "cpu_s_per_1k_workers_1": 0.558,
        "cpu_s_per_1k_workers_2": 0.833,
        "cpu_s_per_1k_workers_4": 1.01,
        "cpu_s_per_1k_sink_1": 0.392,
        "cpu_s_per_1k_sink_2": 0.525,
        "cpu_s_per_1k_sink_4": 0.45,
    },
    "e2e_intake": {
        "orders_per_s": 642.0,
        "orders": 200,
        "cpu_share": {"publisher": 0.225, "sink": 0.0, "client": 0.165},
        "cpu_ms_per_order": 0.607,
        "cpus": 2,
        "cpu_bound_per_s": 3290.0,
    },
    "e2e_single": {
        "events_per_s": 723.0,
        "intake_orders_per_s": 780.0,
        "orders": 200,
        "cpu_share": {"publisher": 0.362, "sink": 0.0723, "client": 0.185},
        "cpu_ms_per_order": 0.855,
        "cpus": 2,
        "cpu_bound_per_s": 2340.0,
        "latency_at_full_load": {"p50_ms": 6.99, "p99_ms": 26.7, "max_ms": 32.6},
    },
    "e2e_bulk": {
        "events_per_s": 4400.0,
        "intake_orders_per_s": 25700.0,
        "orders": 200,
        "batch": 250,
        "cpu_share": {"publisher": 0.22, "sink": 0.22, "client": 0.0715},
        "cpu_ms_per_order": 0.116,
        "cpus": 2,
        "cpu_bound_per_s": 17200.0,
    },
    "e2e_latency": {
        "offered_per_s": 362.0,
        "orders": 435,
        "stall_s": 1.0,
        "idle": {"p50_ms": 2.53, "p99_ms": 16.5, "max_ms": 27.3},
        "stalled": {"p50_ms": 436.0, "p99_ms": 996.0, "max_ms": 1010.0},
    },
    "pg_e2e_intake": {
        "orders_per_s": 405.0,
        "orders": 200,
        "cpu_share": {"publisher": 0.182, "sink": 0.0, "postgres": 0.081, "client": 0.12},
        "cpu_ms_per_order": 0.947,
        "cpus": 2,
        "cpu_bound_per_s": 2110.0,
    },
    "pg_e2e_single": {
        "events_per_s": 338.0,
        "intake_orders_per_s": 370.0,
        "orders": 200,
        "cpu_share": {"publisher": 0.219, "sink": 0.0675, "postgres": 0.186, "client": 0.0984},
        "cpu_ms_per_order": 1.69,
        "cpus": 2,
        "cpu_bound_per_s": 1180.0,
        "latency_at_full_load": {"p50_ms": 15.6, "p99_ms": 44.5, "max_ms": 48.7},
    },
    "pg_e2e_bulk": {
        "events_per_s": 679.0,
        "intake_orders_per_s": 8560.0,
        "orders": 200,
        "batch": 250,
        "cpu_share": {"publisher": 0.136, "sink": 0.102, "postgres": 0.204, "client": 0.0415},
        "cpu_ms_per_order": 0.711,
        "cpus": 2,
        "cpu_bound_per_s": 2810.0,
    },
    "pg_e2e_latency": {
        "offered_per_s": 169.0,
        "orders": 203,
        "stall_s": 1.0,
        "idle": {"p50_ms": 16.3, "p99_ms": 55.8, "max_ms": 58.2},
        "stalled": {"p50_ms": 594.0, "p99_ms": 1030.0, "max_ms": 1040.0},
    },
    "pg_relay_single": {"events_per_s": 509.0, "backlog": 1000, "pipeline": 8},
    "pg_relay_batch": {"events_per_s": 3950.0, "backlog": 1000, "pipeline": 8},
    "pg_relay_single_serial": {
        "events_per_s": 102.0,
        "backlog": 1000,
        "pipeline": 1,
        "ms_per_event": 9.83,
        "ms_per_event_in_requests": 9.51,
        "ms_per_event_elsewhere": 0.322,
    },
    "pg_relay_batch_serial": {
        "events_per_s": 1830.0,
        "backlog": 1000,
        "pipeline": 1,
        "ms_per_event": 0.546,
        "ms_per_event_in_requests": 0.501,
        "ms_per_event_elsewhere": 0.0451,
    },
    "event_costs": {
        "data_bytes": 1024,
        "order_intake_us": 8.89,
        "checked_event_us": {"order": 15.0, "generic": 69.2, "generic_floats": 260.0},
        "checked_parsed_us": {"order": 4.7, "generic": 9.5, "generic_floats": 35.2},
        "checked_parsed_dated_us": 10.25,
        "canonical_parts_us": {"order": 8.62, "generic": 60.7, "generic_floats": 257.0},
        "json_loads_us": {"order": 5.34, "generic": 23.5, "generic_floats": 25.3},
        "stored_read_us": {"order": 0.37, "generic": 3.06, "generic_floats": 3.1},
        "envelope_read_us": {"order": 0.61, "generic": 0.72, "generic_floats": 0.74},
        "loads_strict_us": {"order": 7.1, "generic": 61.0, "generic_floats": 62.5},
        "schema_bytes": 1652,
        "schema_check_us": {"generic": 6.75, "generic_floats": 7.75},
    },
    "relay_single_generic": {
        "events_per_s_order": 1350.0,
        "events_per_s_generic": 1100.0,
        "events_per_s_generic_floats": 900.0,
        "rounds_per_kind": 2,
        "backlog_per_round": 1000,
        "delivery": "one event per request, up to 8 in flight",
    },
    "relay_batch_generic": {
        "events_per_s_order": 2400.0,
        "events_per_s_generic": 2040.0,
        "events_per_s_generic_floats": 1300.0,
        "rounds_per_kind": 2,
        "backlog_per_round": 1000,
        "delivery": "batches of up to 16, up to 8 in flight",
    },
    "pg_relay_single_generic": {
        "events_per_s_order": 500.0,
        "events_per_s_generic": 420.0,
        "events_per_s_generic_floats": 350.0,
        "rounds_per_kind": 2,
        "backlog_per_round": 1000,
        "delivery": "one event per request, up to 8 in flight",
    },
    "pg_relay_batch_generic": {
        "events_per_s_order": 3900.0,
        "events_per_s_generic": 2990.0,
        "events_per_s_generic_floats": 2200.0,
        "rounds_per_kind": 2,
        "backlog_per_round": 1000,
        "delivery": "batches of up to 16, up to 8 in flight",
    },
    "e2e_single_generic": {
        "events_per_s_order": 700.0,
        "events_per_s_generic": 600.0,
        "events_per_s_generic_floats": 400.0,
        "intake_per_s_order": 760.0,
        "intake_per_s_generic": 650.0,
        "intake_per_s_generic_floats": 430.0,
        "cpu_order": {"cpu_ms_per_order": 0.86, "cpu_bound_per_s": 2330.0},
        "cpu_generic": {"cpu_ms_per_order": 0.95, "cpu_bound_per_s": 2100.0},
        "cpu_generic_floats": {"cpu_ms_per_order": 1.5, "cpu_bound_per_s": 1330.0},
        "rounds_per_kind": 2,
        "events_per_round": 200,
        "route": "POST /orders or POST /events, one per request",
        "batch": 1,
        "clients": 8,
    },
    "e2e_bulk_generic": {
        "events_per_s_order": 4300.0,
        "events_per_s_generic": 3000.0,
        "events_per_s_generic_floats": 1500.0,
        "intake_per_s_order": 25000.0,
        "intake_per_s_generic": 9000.0,
        "intake_per_s_generic_floats": 4000.0,
        "cpu_order": {"cpu_ms_per_order": 0.12, "cpu_bound_per_s": 16700.0},
        "cpu_generic": {"cpu_ms_per_order": 0.3, "cpu_bound_per_s": 6670.0},
        "cpu_generic_floats": {"cpu_ms_per_order": 0.7, "cpu_bound_per_s": 2860.0},
        "rounds_per_kind": 2,
        "events_per_round": 200,
        "route": "POST /orders/batch or POST /events/batch, batches of 250",
        "batch": 250,
        "clients": 8,
    },
    "pg_e2e_single_generic": {
        "events_per_s_order": 340.0,
        "events_per_s_generic": 300.0,
        "events_per_s_generic_floats": 250.0,
        "intake_per_s_order": 370.0,
        "intake_per_s_generic": 320.0,
        "intake_per_s_generic_floats": 270.0,
        "cpu_order": {"cpu_ms_per_order": 1.7, "cpu_bound_per_s": 1180.0},
        "cpu_generic": {"cpu_ms_per_order": 1.8, "cpu_bound_per_s": 1110.0},
        "cpu_generic_floats": {"cpu_ms_per_order": 2.2, "cpu_bound_per_s": 909.0},
        "rounds_per_kind": 2,
        "events_per_round": 200,
        "route": "POST /orders or POST /events, one per request",
        "batch": 1,
        "clients": 8,
    },
    "pg_e2e_bulk_generic": {
        "events_per_s_order": 680.0,
        "events_per_s_generic": 610.0,
        "events_per_s_generic_floats": 500.0,
        "intake_per_s_order": 8500.0,
        "intake_per_s_generic": 5000.0,
        "intake_per_s_generic_floats": 3000.0,
        "cpu_order": {"cpu_ms_per_order": 0.71, "cpu_bound_per_s": 2820.0},
        "cpu_generic": {"cpu_ms_per_order": 0.9, "cpu_bound_per_s": 2220.0},
        "cpu_generic_floats": {"cpu_ms_per_order": 1.3, "cpu_bound_per_s": 1540.0},
        "rounds_per_kind": 2,
        "events_per_round": 200,
        "route": "POST /orders/batch or POST /events/batch, batches of 250",
        "batch": 250,
        "clients": 8,
    },
    "relay_single_handler": {
        "events_per_s_built_in": 1300.0,
        "events_per_s_own": 1250.0,
        "rounds_per_registry": 2,
        "backlog_per_round": 1000,
        "delivery": "one event per request, up to 8 in flight",
        "cpu_us_per_event_built_in": {"relay": 310.0, "sink": 240.0},
        "cpu_us_per_event_own": {"relay": 305.0, "sink": 246.0},
    },
    "relay_batch_handler": {
        "events_per_s_built_in": 2400.0,
        "events_per_s_own": 2100.0,
        "rounds_per_registry": 2,
        "backlog_per_round": 5000,
        "delivery": "batches of up to 16, up to 8 in flight",
        "cpu_us_per_event_built_in": {"relay": 61.0, "sink": 40.0},
        "cpu_us_per_event_own": {"relay": 62.0, "sink": 44.0},
    },
    "pg_relay_single_handler": {
        "events_per_s_built_in": 500.0,
        "events_per_s_own": 480.0,
        "rounds_per_registry": 2,
        "backlog_per_round": 1000,
        "delivery": "one event per request, up to 8 in flight",
        "cpu_us_per_event_built_in": {"relay": 300.0, "sink": 350.0, "postgres": 420.0},
        "cpu_us_per_event_own": {"relay": 301.0, "sink": 352.0, "postgres": 431.0},
    },
    "pg_relay_batch_handler": {
        "events_per_s_built_in": 3900.0,
        "events_per_s_own": 3600.0,
        "rounds_per_registry": 2,
        "backlog_per_round": 5000,
        "delivery": "batches of up to 16, up to 8 in flight",
        "cpu_us_per_event_built_in": {"relay": 70.0, "sink": 60.0, "postgres": 90.0},
        "cpu_us_per_event_own": {"relay": 71.0, "sink": 63.0, "postgres": 95.0},
    },
    "e2e_bulk_handler": {
        "events_per_s_built_in": 4300.0,
        "events_per_s_own": 4000.0,
        "intake_per_s_built_in": 25000.0,
        "intake_per_s_own": 24000.0,
        "cpu_built_in": {"cpu_ms_per_order": 0.12, "cpu_bound_per_s": 16700.0},
        "cpu_own": {"cpu_ms_per_order": 0.125, "cpu_bound_per_s": 16000.0},
        "rounds_per_registry": 2,
        "events_per_round": 5000,
        "route": "POST /orders/batch, batches of 250",
        "batch": 250,
        "clients": 8,
    },
    "pg_e2e_bulk_handler": {
        "events_per_s_built_in": 680.0,
        "events_per_s_own": 600.0,
        "intake_per_s_built_in": 8500.0,
        "intake_per_s_own": 8400.0,
        "cpu_built_in": {"cpu_ms_per_order": 0.71, "cpu_bound_per_s": 2820.0},
        "cpu_own": {"cpu_ms_per_order": 0.74, "cpu_bound_per_s": 2700.0},
        "rounds_per_registry": 2,
        "events_per_round": 5000,
        "route": "POST /orders/batch, batches of 250",
        "batch": 250,
        "clients": 8,
    },
}

# name: (measured, goal as printed, verdict, cases)
EXPECTED: dict[str, tuple[float, str, str, tuple[str, ...]]] = {
    "one event per request vs ceiling": (
        389 / 1430,
        ">= 0.5x",
        "missed",
        ("relay_single", "ceiling"),
    ),
    "  one event per request vs ceiling, --pipeline 1": (
        160 / 1430,
        ">= 0.5x",
        "reference",
        ("relay_single_serial", "ceiling"),
    ),
    "one event per request vs naive peer": (
        389 / 56,
        ">= 1.5x",
        "met",
        ("relay_single", "naive_peer"),
    ),
    "batches vs ceiling": (2750 / 1430, ">= 5x", "missed", ("relay_batch", "ceiling")),
    "  batches vs ceiling, --pipeline 1": (
        1650 / 1430,
        ">= 5x",
        "reference",
        ("relay_batch_serial", "ceiling"),
    ),
    "generic vs orders, one per request": (
        1100 / 1350,
        ">= 0.8x",
        "met",
        ("relay_single_generic",),
    ),
    "  generic vs orders, one per request, floats": (
        900 / 1350,
        ">= 0.8x",
        "reference",
        ("relay_single_generic",),
    ),
    "generic vs orders, batches": (2040 / 2400, ">= 0.8x", "met", ("relay_batch_generic",)),
    "  generic vs orders, batches, floats": (
        1300 / 2400,
        ">= 0.8x",
        "reference",
        ("relay_batch_generic",),
    ),
    "lanes vs global, slow sink, one event per request": (
        251 / 67,
        ">= 5x",
        "missed",
        ("relay_lanes",),
    ),
    "  lanes vs global, one per request, pipeline 8": (
        534 / 352,
        ">= 5x",
        "reference",
        ("relay_lanes",),
    ),
    "lanes vs global, slow sink, batches": (1170 / 829, ">= 5x", "missed", ("relay_lanes",)),
    "  lanes vs global, batches, pipeline 8": (1190 / 1860, ">= 5x", "reference", ("relay_lanes",)),
    "intake p99, sink stalled vs idle": (17.5 / 20.2, "<= 2x", "met", ("intake_latency",)),
    "pending(16), big vs small outbox": (0.0977 / 0.098, "<= 1.5x", "met", ("scaling",)),
    "metrics scrape, big vs small outbox": (0.29 / 0.289, "<= 1.5x", "met", ("scaling",)),
    "throughput, big vs small backlog": (4740 / 4530, ">= 0.8x", "met", ("scaling",)),
    "peak RSS, big vs small backlog": (48.9 - 46.7, "<= 20MiB", "met", ("memory",)),
    "mark of a 32 KiB event vs a 100 B one": (13.0 / 19.2, "<= 2x", "met", ("mark_costs",)),
    "PostgreSQL: batches vs its commit ceiling": (
        3950 / 1720,
        ">= 2x",
        "met",
        ("pg_relay_batch", "pg_commit_ceiling"),
    ),
    "  PostgreSQL: batches vs commit ceiling, --pipeline 1": (
        1830 / 1720,
        ">= 2x",
        "reference",
        ("pg_relay_batch_serial", "pg_commit_ceiling"),
    ),
    "PostgreSQL: one event per request vs ceiling": (
        509 / 1430,
        ">= 0.5x",
        "missed",
        ("pg_relay_single", "ceiling"),
    ),
    "  PostgreSQL: one per request vs ceiling, --pipeline 1": (
        102 / 1430,
        ">= 0.5x",
        "reference",
        ("pg_relay_single_serial", "ceiling"),
    ),
    "PostgreSQL: generic vs orders, one per request": (
        420 / 500,
        ">= 0.8x",
        "met",
        ("pg_relay_single_generic",),
    ),
    "  PostgreSQL: generic vs orders, one per request, floats": (
        350 / 500,
        ">= 0.8x",
        "reference",
        ("pg_relay_single_generic",),
    ),
    "PostgreSQL: generic vs orders, batches": (
        2990 / 3900,
        ">= 0.8x",
        "missed",
        ("pg_relay_batch_generic",),
    ),
    "  PostgreSQL: generic vs orders, batches, floats": (
        2200 / 3900,
        ">= 0.8x",
        "reference",
        ("pg_relay_batch_generic",),
    ),
    "PostgreSQL workers: 4 vs 1, SKU order": (305 / 387, ">= 0.9x", "missed", ("pg_workers",)),
    "PostgreSQL workers: duplicate deliveries, no faults": (0, "<= 0", "met", ("pg_workers",)),
    "PostgreSQL workers: failover after a SIGKILL": (3.51, "<= 4s", "met", ("pg_workers",)),
    "e2e, POST /orders vs 8-client ceiling": (
        723 / 1650,
        ">= 0.35x",
        "met",
        ("e2e_single", "e2e_ceiling"),
    ),
    "e2e, POST /orders vs 1-client ceiling": (
        723 / 1290,
        ">= 1x",
        "missed",
        ("e2e_single", "e2e_ceiling"),
    ),
    "e2e, bulk intake vs 8-client ceiling": (
        4400 / 1650,
        ">= 1x",
        "met",
        ("e2e_bulk", "e2e_ceiling"),
    ),
    "201 to applied at the sink, p99": (16.5, "<= 50ms", "met", ("e2e_latency",)),
    "201 to applied at the sink, p50": (2.53, "<= 10ms", "met", ("e2e_latency",)),
    "e2e, POST /events vs POST /orders": (600 / 700, ">= 0.8x", "met", ("e2e_single_generic",)),
    "  e2e, POST /events vs POST /orders, floats": (
        400 / 700,
        ">= 0.8x",
        "reference",
        ("e2e_single_generic",),
    ),
    "e2e, /events/batch vs /orders/batch": (
        3000 / 4300,
        ">= 0.8x",
        "missed",
        ("e2e_bulk_generic",),
    ),
    "  e2e, /events/batch vs /orders/batch, floats": (
        1500 / 4300,
        ">= 0.8x",
        "reference",
        ("e2e_bulk_generic",),
    ),
    "PostgreSQL: e2e, POST /orders vs 8-client ceiling": (
        338 / 1650,
        ">= 0.35x",
        "missed",
        ("pg_e2e_single", "e2e_ceiling"),
    ),
    "PostgreSQL: e2e, POST /orders vs 1-client ceiling": (
        338 / 1290,
        ">= 1x",
        "missed",
        ("pg_e2e_single", "e2e_ceiling"),
    ),
    "PostgreSQL: e2e, bulk intake vs 8-client ceiling": (
        679 / 1650,
        ">= 1x",
        "missed",
        ("pg_e2e_bulk", "e2e_ceiling"),
    ),
    "PostgreSQL: 201 to applied at the sink, p99": (55.8, "<= 50ms", "missed", ("pg_e2e_latency",)),
    "PostgreSQL: 201 to applied at the sink, p50": (16.3, "<= 10ms", "missed", ("pg_e2e_latency",)),
    "PostgreSQL: e2e, POST /events vs POST /orders": (
        300 / 340,
        ">= 0.8x",
        "met",
        ("pg_e2e_single_generic",),
    ),
    "  PostgreSQL: e2e, POST /events vs POST /orders, floats": (
        250 / 340,
        ">= 0.8x",
        "reference",
        ("pg_e2e_single_generic",),
    ),
    "PostgreSQL: e2e, /events/batch vs /orders/batch": (
        610 / 680,
        ">= 0.8x",
        "met",
        ("pg_e2e_bulk_generic",),
    ),
    "  PostgreSQL: e2e, /events/batch vs /orders/batch, floats": (
        500 / 680,
        ">= 0.8x",
        "reference",
        ("pg_e2e_bulk_generic",),
    ),
    "own handler vs built-in, one per request": (
        1250 / 1300,
        ">= 0.9x",
        "met",
        ("relay_single_handler",),
    ),
    "own handler vs built-in, batches": (
        2100 / 2400,
        ">= 0.9x",
        "missed",
        ("relay_batch_handler",),
    ),
    "own handler vs built-in, e2e bulk": (4000 / 4300, ">= 0.9x", "met", ("e2e_bulk_handler",)),
    "PostgreSQL: own handler vs built-in, one per request": (
        480 / 500,
        ">= 0.9x",
        "met",
        ("pg_relay_single_handler",),
    ),
    "PostgreSQL: own handler vs built-in, batches": (
        3600 / 3900,
        ">= 0.9x",
        "met",
        ("pg_relay_batch_handler",),
    ),
    "PostgreSQL: own handler vs built-in, e2e bulk": (
        600 / 680,
        ">= 0.9x",
        "missed",
        ("pg_e2e_bulk_handler",),
    ),
}
# Each target's second line in the report, at the --quick sizes.
DETAILS = {
    "one event per request vs ceiling": (
        "relay_single events/s / ceiling round trips/s (default: up to 8 in flight)"
    ),
    "  one event per request vs ceiling, --pipeline 1": (
        "relay_single_serial events/s / ceiling round trips/s"
    ),
    "one event per request vs naive peer": "relay_single events/s / naive_peer events/s",
    "batches vs ceiling": (
        "relay_batch events/s / ceiling round trips/s (default: up to 8 in flight)"
    ),
    "  batches vs ceiling, --pipeline 1": "relay_batch_serial events/s / ceiling round trips/s",
    "lanes vs global, slow sink, one event per request": (
        "per-SKU lanes events/s / global order events/s, one in flight per line, sink stall 5 ms"
    ),
    "  lanes vs global, one per request, pipeline 8": (
        "per-SKU lanes events/s / global order events/s, default pipelining, sink stall 5 ms"
    ),
    "lanes vs global, slow sink, batches": (
        "per-SKU lanes events/s / global order events/s, one in flight per line, sink stall 5 ms"
    ),
    "  lanes vs global, batches, pipeline 8": (
        "per-SKU lanes events/s / global order events/s, default pipelining, sink stall 5 ms"
    ),
    "intake p99, sink stalled vs idle": (
        "POST /orders p99 while the sink stalls 2 s / p99 while idle"
    ),
    "pending(16), big vs small outbox": "median time at 100,000 sent rows / at 1,000",
    "metrics scrape, big vs small outbox": "median time at 100,000 sent rows / at 1,000",
    "throughput, big vs small backlog": "events/s from a backlog of 5,000 / from 500",
    "peak RSS, big vs small backlog": "MiB above: draining 10,000 minus draining 1,000",
    "mark of a 32 KiB event vs a 100 B one": (
        "mark_costs us per entry marked on SQLite, events of 32,768 B / of 100 B, 512 entries"
        " each in calls of 128"
    ),
    "PostgreSQL: batches vs its commit ceiling": (
        "pg_relay_batch events/s / pg_commit_ceiling commits/s (up to 8 in flight)"
    ),
    "  PostgreSQL: batches vs commit ceiling, --pipeline 1": (
        "pg_relay_batch_serial events/s / pg_commit_ceiling commits/s"
    ),
    "PostgreSQL: one event per request vs ceiling": (
        "pg_relay_single events/s / ceiling round trips/s (up to 8 in flight)"
    ),
    "  PostgreSQL: one per request vs ceiling, --pipeline 1": (
        "pg_relay_single_serial events/s / ceiling round trips/s"
    ),
    "PostgreSQL workers: 4 vs 1, SKU order": (
        "pg_workers events/s with 4 workers / with 1 (64 SKUs, sink stall 5 ms, one event"
        " per request); 'not slower', less 10% for run-to-run noise"
    ),
    "PostgreSQL workers: duplicate deliveries, no faults": (
        "inbox deliveries beyond the first, all six pg_workers drains"
    ),
    "PostgreSQL workers: failover after a SIGKILL": (
        "SIGKILL of a worker -> first ACK of its lanes by another (bound: lease TTL 2 s + 2 s)"
    ),
    "e2e, POST /orders vs 8-client ceiling": (
        "e2e_single events/s (8 clients, until applied and marked) / e2e_ceiling 8-client"
        " round trips/s"
    ),
    "e2e, POST /orders vs 1-client ceiling": (
        "e2e_single events/s / e2e_ceiling 1-client round trips/s"
    ),
    "e2e, bulk intake vs 8-client ceiling": (
        "e2e_bulk events/s (POST /orders/batch of 250) / e2e_ceiling 8-client round trips/s"
    ),
    "201 to applied at the sink, p99": "e2e_latency: paced at 0.5x the e2e maximum, healthy sink",
    "201 to applied at the sink, p50": "e2e_latency: paced at 0.5x the e2e maximum, healthy sink",
    "PostgreSQL: e2e, POST /orders vs 8-client ceiling": (
        "pg_e2e_single events/s (8 clients, until applied and marked) / e2e_ceiling "
        "8-client round trips/s"
    ),
    "PostgreSQL: e2e, POST /orders vs 1-client ceiling": (
        "pg_e2e_single events/s / e2e_ceiling 1-client round trips/s"
    ),
    "PostgreSQL: e2e, bulk intake vs 8-client ceiling": (
        "pg_e2e_bulk events/s (POST /orders/batch of 250) / e2e_ceiling 8-client round trips/s"
    ),
    "PostgreSQL: 201 to applied at the sink, p99": (
        "pg_e2e_latency: paced at 0.5x the e2e maximum, healthy sink"
    ),
    "PostgreSQL: 201 to applied at the sink, p50": (
        "pg_e2e_latency: paced at 0.5x the e2e maximum, healthy sink"
    ),
    "generic vs orders, one per request": (
        "relay_single_generic events/s of 1,024 B data, integers only / its order events/s, "
        "alternating rounds by kind"
    ),
    "  generic vs orders, one per request, floats": (
        "relay_single_generic events/s of 1,024 B data, floats / its order events/s, "
        "alternating rounds by kind"
    ),
    "generic vs orders, batches": (
        "relay_batch_generic events/s of 1,024 B data, integers only / its order events/s, "
        "alternating rounds by kind"
    ),
    "  generic vs orders, batches, floats": (
        "relay_batch_generic events/s of 1,024 B data, floats / its order events/s, "
        "alternating rounds by kind"
    ),
    "PostgreSQL: generic vs orders, one per request": (
        "pg_relay_single_generic events/s of 1,024 B data, integers only / its order "
        "events/s, alternating rounds by kind"
    ),
    "  PostgreSQL: generic vs orders, one per request, floats": (
        "pg_relay_single_generic events/s of 1,024 B data, floats / its order events/s, "
        "alternating rounds by kind"
    ),
    "PostgreSQL: generic vs orders, batches": (
        "pg_relay_batch_generic events/s of 1,024 B data, integers only / its order events/s, "
        "alternating rounds by kind"
    ),
    "  PostgreSQL: generic vs orders, batches, floats": (
        "pg_relay_batch_generic events/s of 1,024 B data, floats / its order events/s, "
        "alternating rounds by kind"
    ),
    "e2e, POST /events vs POST /orders": (
        "e2e_single_generic events/s of 1,024 B data, integers only / its order events/s, "
        "alternating rounds by kind"
    ),
    "  e2e, POST /events vs POST /orders, floats": (
        "e2e_single_generic events/s of 1,024 B data, floats / its order events/s, "
        "alternating rounds by kind"
    ),
    "e2e, /events/batch vs /orders/batch": (
        "e2e_bulk_generic events/s of 1,024 B data, integers only / its order events/s, "
        "alternating rounds by kind"
    ),
    "  e2e, /events/batch vs /orders/batch, floats": (
        "e2e_bulk_generic events/s of 1,024 B data, floats / its order events/s, alternating "
        "rounds by kind"
    ),
    "PostgreSQL: e2e, POST /events vs POST /orders": (
        "pg_e2e_single_generic events/s of 1,024 B data, integers only / its order events/s, "
        "alternating rounds by kind"
    ),
    "  PostgreSQL: e2e, POST /events vs POST /orders, floats": (
        "pg_e2e_single_generic events/s of 1,024 B data, floats / its order events/s, "
        "alternating rounds by kind"
    ),
    "PostgreSQL: e2e, /events/batch vs /orders/batch": (
        "pg_e2e_bulk_generic events/s of 1,024 B data, integers only / its order events/s, "
        "alternating rounds by kind"
    ),
    "  PostgreSQL: e2e, /events/batch vs /orders/batch, floats": (
        "pg_e2e_bulk_generic events/s of 1,024 B data, floats / its order events/s, "
        "alternating rounds by kind"
    ),
    "own handler vs built-in, one per request": (
        "relay_single_handler events/s with bench.handlers:ONE_ROW (a row of its own per "
        "order) / with the built-in warehouse, alternating rounds by registry"
    ),
    "own handler vs built-in, batches": (
        "relay_batch_handler events/s with bench.handlers:ONE_ROW (a row of its own per "
        "order) / with the built-in warehouse, alternating rounds by registry"
    ),
    "own handler vs built-in, e2e bulk": (
        "e2e_bulk_handler events/s with bench.handlers:ONE_ROW (a row of its own per "
        "order) / with the built-in warehouse, alternating rounds by registry"
    ),
    "PostgreSQL: own handler vs built-in, one per request": (
        "pg_relay_single_handler events/s with bench.handlers:ONE_ROW (a row of its own per "
        "order) / with the built-in warehouse, alternating rounds by registry"
    ),
    "PostgreSQL: own handler vs built-in, batches": (
        "pg_relay_batch_handler events/s with bench.handlers:ONE_ROW (a row of its own per "
        "order) / with the built-in warehouse, alternating rounds by registry"
    ),
    "PostgreSQL: own handler vs built-in, e2e bulk": (
        "pg_e2e_bulk_handler events/s with bench.handlers:ONE_ROW (a row of its own per "
        "order) / with the built-in warehouse, alternating rounds by registry"
    ),
}
# The most each end-to-end ratio can reach with every CPU busy: the numerator case's
# cpu_bound_per_s over the same denominator.
REACH = {
    "e2e, POST /orders vs 8-client ceiling": 2340 / 1650,
    "e2e, POST /orders vs 1-client ceiling": 2340 / 1290,
    "e2e, bulk intake vs 8-client ceiling": 17200 / 1650,
    "PostgreSQL: e2e, POST /orders vs 8-client ceiling": 1180 / 1650,
    "PostgreSQL: e2e, POST /orders vs 1-client ceiling": 1180 / 1290,
    "PostgreSQL: e2e, bulk intake vs 8-client ceiling": 2810 / 1650,
    "e2e, POST /events vs POST /orders": 2100 / 700,
    "  e2e, POST /events vs POST /orders, floats": 1330 / 700,
    "e2e, /events/batch vs /orders/batch": 6670 / 4300,
    "  e2e, /events/batch vs /orders/batch, floats": 2860 / 4300,
    "PostgreSQL: e2e, POST /events vs POST /orders": 1110 / 340,
    "  PostgreSQL: e2e, POST /events vs POST /orders, floats": 909 / 340,
    "PostgreSQL: e2e, /events/batch vs /orders/batch": 2220 / 680,
    "  PostgreSQL: e2e, /events/batch vs /orders/batch, floats": 1540 / 680,
    "own handler vs built-in, e2e bulk": 16000 / 4300,
    "PostgreSQL: own handler vs built-in, e2e bulk": 2700 / 680,
}
# Each case's line in the report, as printed for RESULTS.
LINES = {
    "ceiling": (
        "1,430 round trips/s (1,000 sequential); batches of 16 to the same server: 17,800 events/s"
    ),
    "commit_ceiling": "268 durable commits/s (1,000)",
    "naive_peer": "56 events/s (backlog 1,000)",
    "relay_single": (
        "389 events/s (backlog 1,000, up to 8 in flight) = 0.27x ceiling, 6.95x naive peer"
    ),
    "relay_batch": "2,750 events/s (backlog 1,000, up to 8 in flight) = 1.92x ceiling",
    "relay_single_serial": (
        "160 events/s (backlog 1,000, one request in flight) = 0.11x ceiling; per event "
        "6.270 ms = 5.770 in requests + 0.497 elsewhere"
    ),
    "relay_batch_serial": (
        "1,650 events/s (backlog 1,000, one request in flight) = 1.15x ceiling; per event"
        " 0.606 ms = 0.535 in requests + 0.071 elsewhere"
    ),
    "relay_lanes": (
        "2 x 200 per mode, 5 ms sink, 8 SKUs; one/request, one in flight: global 67, "
        "lanes 251 events/s = 3.75x; one/request, pipelined: global 352, lanes 534 "
        "events/s = 1.52x; batches, one in flight: global 829, lanes 1,170 events/s = "
        "1.41x; batches, pipelined: global 1,860, lanes 1,190 events/s = 0.64x"
    ),
    "intake_latency": (
        "healthy sink p50 4.8 / p99 20.2 ms; sink stalled p50 7.4 / p99 17.5 ms = 0.87x "
        "(50 requests each)"
    ),
    "e2e_ceiling": (
        "trivial handler: 1 client 1,290, 8 clients 1,650 round trips/s (200 each); CPU "
        "per round trip, clients and server together: 1 client 0.45 ms (0.57 CPUs busy), "
        "8 clients 0.32 ms (0.53 CPUs busy)"
    ),
    "scaling": (
        "pending(16) 0.098 -> 0.098 ms (1.00x), scrape 0.289 -> 0.290 ms (1.00x) at 1,000"
        " -> 100,000 sent rows; throughput from 500/2,000/5,000: 4,530 / 6,350 / 4,740 "
        "events/s (1.05x); lanes draining 800 over 8 / 2,000 SKUs: 2,810 / 328 events/s"
    ),
    "memory": "peak RSS 46.7 MiB draining 1,000, 48.9 MiB draining 10,000 (+2.2 MiB)",
    "mark_costs": (
        "per entry marked, events of 100 B / 1,024 B / 8,192 B / 32,768 B: 19.2 / 27.9 / 15.1 "
        "/ 13.0 us, WAL 130 / 1,032 / 129 / 129 bytes (512 entries per size in calls of 128, "
        "rounds: 2; events of 2,048 characters or more kept apart)"
    ),
    "pg_commit_ceiling": (
        "1,720 durable commits/s (1,000; fsync on, synchronous_commit on, fdatasync)"
    ),
    "pg_workers": (
        "1 workers 387, 2 workers 307, 4 workers 305 events/s (2 x 600 each, 64 SKUs, 5 "
        "ms sink, one per request); CPU s per 1,000 (workers + sink) 0.56 + 0.39, 0.83 + "
        "0.53, 1.01 + 0.45; 0 duplicates; failover 3.51 s (lease TTL 2 s)"
    ),
    "e2e_intake": (
        "POST /orders alone, sink stopped: 642 orders/s (200, 8 clients) = 0.50x "
        "1-client, 0.39x 8-client ceiling, 2.40x commit ceiling; CPU publisher 22%, sink "
        "0%, client 16%; 0.61 ms CPU per order in all = 1.90x an 8-client ceiling round "
        "trip's, at most 3,290/s with all 2 CPUs busy (1.99x 8-client ceiling)"
    ),
    "e2e_single": (
        "723 events/s until applied and marked (200 orders, POST /orders, 8 clients; the "
        "answers at 780/s) = 0.56x 1-client, 0.44x 8-client ceiling, 2.70x commit "
        "ceiling; CPU publisher 36%, sink 7%, client 18%; 0.85 ms CPU per order in all = "
        "2.68x an 8-client ceiling round trip's, at most 2,340/s with all 2 CPUs busy "
        "(1.42x 8-client ceiling); 201 to applied at this load p50 7.0 / p99 26.7 / max "
        "32.6 ms"
    ),
    "e2e_bulk": (
        "4,400 events/s until applied and marked (200 orders, POST /orders/batch of 250, "
        "8 clients; the answers at 25,700/s) = 3.41x 1-client, 2.67x 8-client ceiling, "
        "16.42x commit ceiling; CPU publisher 22%, sink 22%, client 7%; 0.12 ms CPU per "
        "order in all = 0.36x an 8-client ceiling round trip's, at most 17,200/s with all"
        " 2 CPUs busy (10.42x 8-client ceiling)"
    ),
    "e2e_latency": (
        "at 362 orders/s offered (435): healthy sink p50 2.5 / p99 16.5 / max 27.3 ms; "
        "sink stopped 1 s: p50 436.0 / p99 996.0 / max 1010.0 ms"
    ),
    "pg_e2e_intake": (
        "POST /orders alone, sink stopped: 405 orders/s (200, 8 clients) = 0.31x "
        "1-client, 0.25x 8-client ceiling, 0.24x commit ceiling; CPU publisher 18%, sink "
        "0%, postgres 8%, client 12%; 0.95 ms CPU per order in all = 2.97x an 8-client "
        "ceiling round trip's, at most 2,110/s with all 2 CPUs busy (1.28x 8-client "
        "ceiling)"
    ),
    "pg_e2e_single": (
        "338 events/s until applied and marked (200 orders, POST /orders, 8 clients; the "
        "answers at 370/s) = 0.26x 1-client, 0.20x 8-client ceiling, 0.20x commit "
        "ceiling; CPU publisher 22%, sink 7%, postgres 19%, client 10%; 1.69 ms CPU per "
        "order in all = 5.30x an 8-client ceiling round trip's, at most 1,180/s with all "
        "2 CPUs busy (0.72x 8-client ceiling); 201 to applied at this load p50 15.6 / p99"
        " 44.5 / max 48.7 ms"
    ),
    "pg_e2e_bulk": (
        "679 events/s until applied and marked (200 orders, POST /orders/batch of 250, 8 "
        "clients; the answers at 8,560/s) = 0.53x 1-client, 0.41x 8-client ceiling, 0.39x"
        " commit ceiling; CPU publisher 14%, sink 10%, postgres 20%, client 4%; 0.71 ms "
        "CPU per order in all = 2.23x an 8-client ceiling round trip's, at most 2,810/s "
        "with all 2 CPUs busy (1.70x 8-client ceiling)"
    ),
    "pg_e2e_latency": (
        "at 169 orders/s offered (203): healthy sink p50 16.3 / p99 55.8 / max 58.2 ms; "
        "sink stopped 1 s: p50 594.0 / p99 1030.0 / max 1040.0 ms"
    ),
    "pg_relay_single": (
        "509 events/s (backlog 1,000, up to 8 in flight) = 0.36x ceiling, 0.30x "
        "PostgreSQL commit ceiling, 1.31x SQLite"
    ),
    "pg_relay_batch": (
        "3,950 events/s (backlog 1,000, up to 8 in flight) = 2.76x ceiling, 2.30x "
        "PostgreSQL commit ceiling, 1.44x SQLite"
    ),
    "pg_relay_single_serial": (
        "102 events/s (backlog 1,000, one in flight) = 0.07x ceiling, 0.06x PostgreSQL "
        "commit ceiling, 0.64x SQLite; per event 9.830 ms = 9.510 in requests + 0.322 "
        "elsewhere"
    ),
    "pg_relay_batch_serial": (
        "1,830 events/s (backlog 1,000, one in flight) = 1.28x ceiling, 1.06x PostgreSQL "
        "commit ceiling, 1.11x SQLite; per event 0.546 ms = 0.501 in requests + 0.045 "
        "elsewhere"
    ),
    "event_costs": (
        "us per event, order / 1 KiB / 1 KiB with floats: checked_event 15.0 / 69.2 / 260.0 "
        "(parsed 4.7 / 9.5 / 35.2; 1 KiB with text times 10.2), canonical_parts 8.6 / 60.7 / "
        "257.0, json.loads 5.3 / 23.5 / "
        "25.3 (orjson 0.4 / 3.1 / 3.1; envelope 0.6 / 0.7 / 0.7), loads_strict 7.1 / 61.0 / "
        "62.5; an order at POST /orders "
        "8.9; Schemas.check (1,652 B schema) 6.8 / 7.8"
    ),
    "relay_single_generic": (
        "orders 1,350, 1 KiB 1,100 (0.81x), 1 KiB with floats 900 (0.67x) events/s (2 x 1,000 "
        "per kind, one event per request, up to 8 in flight)"
    ),
    "relay_batch_generic": (
        "orders 2,400, 1 KiB 2,040 (0.85x), 1 KiB with floats 1,300 (0.54x) events/s (2 x "
        "1,000 per kind, batches of up to 16, up to 8 in flight)"
    ),
    "pg_relay_single_generic": (
        "orders 500, 1 KiB 420 (0.84x), 1 KiB with floats 350 (0.70x) events/s (2 x 1,000 per "
        "kind, one event per request, up to 8 in flight)"
    ),
    "pg_relay_batch_generic": (
        "orders 3,900, 1 KiB 2,990 (0.77x), 1 KiB with floats 2,200 (0.56x) events/s (2 x "
        "1,000 per kind, batches of up to 16, up to 8 in flight)"
    ),
    "e2e_single_generic": (
        "orders 700, 1 KiB 600 (0.86x), 1 KiB with floats 400 (0.57x) events/s until applied "
        "and marked (2 x 200 per kind, POST /orders or POST /events, one per request, 8 "
        "clients); answered at orders 760, 1 KiB 650 (0.86x), 1 KiB with floats 430 (0.57x) "
        "per s; CPU per event in all (ms): orders 0.86, 1 KiB 0.95, 1 KiB with floats 1.50"
    ),
    "e2e_bulk_generic": (
        "orders 4,300, 1 KiB 3,000 (0.70x), 1 KiB with floats 1,500 (0.35x) events/s until "
        "applied and marked (2 x 200 per kind, POST /orders/batch or POST /events/batch, "
        "batches of 250, 8 clients); answered at orders 25,000, 1 KiB 9,000 (0.36x), 1 KiB "
        "with floats 4,000 (0.16x) per s; CPU per event in all (ms): orders 0.12, 1 KiB 0.30, "
        "1 KiB with floats 0.70"
    ),
    "pg_e2e_single_generic": (
        "orders 340, 1 KiB 300 (0.88x), 1 KiB with floats 250 (0.74x) events/s until applied "
        "and marked (2 x 200 per kind, POST /orders or POST /events, one per request, 8 "
        "clients); answered at orders 370, 1 KiB 320 (0.86x), 1 KiB with floats 270 (0.73x) "
        "per s; CPU per event in all (ms): orders 1.70, 1 KiB 1.80, 1 KiB with floats 2.20"
    ),
    "pg_e2e_bulk_generic": (
        "orders 680, 1 KiB 610 (0.90x), 1 KiB with floats 500 (0.74x) events/s until applied "
        "and marked (2 x 200 per kind, POST /orders/batch or POST /events/batch, batches of "
        "250, 8 clients); answered at orders 8,500, 1 KiB 5,000 (0.59x), 1 KiB with floats "
        "3,000 (0.35x) per s; CPU per event in all (ms): orders 0.71, 1 KiB 0.90, 1 KiB with "
        "floats 1.30"
    ),
    "relay_single_handler": (
        "built-in 1,300, own handler 1,250 (0.96x) events/s (2 x 1,000 per registry, one "
        "event per request, up to 8 in flight); CPU us per event, built-in / own: relay "
        "310 / 305, sink 240 / 246"
    ),
    "relay_batch_handler": (
        "built-in 2,400, own handler 2,100 (0.88x) events/s (2 x 5,000 per registry, "
        "batches of up to 16, up to 8 in flight); CPU us per event, built-in / own: relay "
        "61 / 62, sink 40 / 44"
    ),
    "pg_relay_single_handler": (
        "built-in 500, own handler 480 (0.96x) events/s (2 x 1,000 per registry, one event "
        "per request, up to 8 in flight); CPU us per event, built-in / own: relay 300 / "
        "301, sink 350 / 352, postgres 420 / 431"
    ),
    "pg_relay_batch_handler": (
        "built-in 3,900, own handler 3,600 (0.92x) events/s (2 x 5,000 per registry, "
        "batches of up to 16, up to 8 in flight); CPU us per event, built-in / own: relay "
        "70 / 71, sink 60 / 63, postgres 90 / 95"
    ),
    "e2e_bulk_handler": (
        "built-in 4,300, own handler 4,000 (0.93x) events/s until applied and marked (2 x "
        "5,000 per registry, POST /orders/batch, batches of 250, 8 clients); answered at "
        "built-in 25,000, own handler 24,000 (0.96x) per s; CPU per event in all, built-in "
        "/ own: 0.120 / 0.125 ms"
    ),
    "pg_e2e_bulk_handler": (
        "built-in 680, own handler 600 (0.88x) events/s until applied and marked (2 x "
        "5,000 per registry, POST /orders/batch, batches of 250, 8 clients); answered at "
        "built-in 8,500, own handler 8,400 (0.99x) per s; CPU per event in all, built-in "
        "/ own: 0.710 / 0.740 ms"
    ),
}


def verdict(t: Target) -> str:
    if t.reference:
        return "reference"
    return {True: "met", False: "missed", None: "not measured"}[t.met]


def goal(t: Target) -> str:
    return f"{t.comparison} {t.target:g}{t.unit}"


def judged(results: dict[str, Figures]) -> dict[str, Target]:
    return {t.name: t for t in evaluate(results, QUICK)}


def test_every_target_takes_its_own_figures_and_goal_in_the_tables_order() -> None:
    targets = evaluate(RESULTS, QUICK)
    assert [t.name for t in targets] == list(EXPECTED)
    for t in targets:
        measured, printed, result, cases = EXPECTED[t.name]
        assert (t.measured, goal(t), verdict(t), t.cases) == (measured, printed, result, cases)
        assert (t.detail, t.why_not) == (DETAILS[t.name], None)
        assert t.reach == REACH.get(t.name), t.name


def test_a_run_of_some_cases_has_only_the_targets_of_those_cases() -> None:
    sqlite = {"ceiling", "commit_ceiling", "naive_peer", "relay_single", "relay_batch"}
    sqlite |= {"relay_single_serial", "relay_batch_serial", "relay_lanes", "intake_latency"}
    sqlite |= {"scaling", "memory"}
    targets = evaluate({name: RESULTS[name] for name in sqlite}, QUICK)
    assert len(targets) == 14 and sum(t.reference for t in targets) == 4
    postgres = ("ceiling", "pg_commit_ceiling", "pg_relay_single", "pg_relay_batch", "pg_workers")
    assert [t.name for t in evaluate({n: RESULTS[n] for n in postgres}, QUICK)] == [
        "PostgreSQL: batches vs its commit ceiling",
        "PostgreSQL: one event per request vs ceiling",
        "PostgreSQL workers: 4 vs 1, SKU order",
        "PostgreSQL workers: duplicate deliveries, no faults",
        "PostgreSQL workers: failover after a SIGKILL",
    ]
    assert evaluate({}, QUICK) == []


@pytest.mark.parametrize("case", sorted({c for _, _, _, cases in EXPECTED.values() for c in cases}))
def test_a_case_not_run_failed_or_not_available_leaves_its_targets_unmeasured(case: str) -> None:
    mine = {name for name, (_, _, _, cases) in EXPECTED.items() if case in cases}
    without = dict(RESULTS)
    del without[case]
    assert set(judged(without)) == set(EXPECTED) - mine
    for figures, why in (
        ({"available": False, "reason": "no such route"}, f"{case} not available: no such route"),
        ({"available": True, "error": "BenchError: stuck"}, f"{case} failed: BenchError: stuck"),
    ):
        targets = judged({**RESULTS, case: figures})
        assert set(targets) == set(EXPECTED)
        for name, t in targets.items():
            if name in mine:
                assert (t.measured, t.met, t.why_not, t.reach) == (None, None, why, None), name
            else:
                assert t.measured == EXPECTED[name][0], name


def test_a_figure_missing_or_a_zero_reference_is_not_measured() -> None:
    broken = copy.deepcopy(RESULTS)
    broken["ceiling"]["round_trips_per_s"] = 0
    del broken["memory"]["peak_rss_mib"][1]
    targets = judged(broken)
    for name in ("one event per request vs ceiling", "peak RSS, big vs small backlog"):
        assert (targets[name].measured, targets[name].why_not) == (None, "figure missing")


def test_the_failover_bound_is_the_one_the_case_recorded_else_the_lease_ttl_and_2_s() -> None:
    name = "PostgreSQL workers: failover after a SIGKILL"
    recorded = copy.deepcopy(RESULTS)
    recorded["pg_workers"]["failover_bound_s"] = 6.5
    assert judged(recorded)[name].target == 6.5
    del recorded["pg_workers"]["failover_bound_s"]
    assert judged(recorded)[name].target == workers.LEASE_TTL_S + 2.0


def test_details_name_the_runs_sizes() -> None:
    quick, full = ({t.name: t.detail for t in evaluate(RESULTS, s)} for s in (QUICK, FULL))
    scrape = "metrics scrape, big vs small outbox"
    assert quick[scrape] == "median time at 100,000 sent rows / at 1,000"
    assert full[scrape] == "median time at 1,000,000 sent rows / at 1,000"
    assert full["throughput, big vs small backlog"] == (
        "events/s from a backlog of 100,000 / from 1,000"
    )
    assert full["peak RSS, big vs small backlog"] == (
        "MiB above: draining 100,000 minus draining 1,000"
    )


def test_a_target_as_the_json_reports_it() -> None:
    targets = judged({**RESULTS, "pg_workers": {"available": False, "reason": "no server"}})
    assert targets["e2e, bulk intake vs 8-client ceiling"].to_dict() == {
        "name": "e2e, bulk intake vs 8-client ceiling",
        "detail": "e2e_bulk events/s (POST /orders/batch of 250) / e2e_ceiling 8-client "
        "round trips/s",
        "measured": 4400 / 1650,
        "target": 1.0,
        "comparison": ">=",
        "unit": "x",
        "met": True,
        "reference": False,
        "cases": ["e2e_bulk", "e2e_ceiling"],
        "cpu_reach": 17200 / 1650,
    }
    assert targets["PostgreSQL workers: duplicate deliveries, no faults"].to_dict() == {
        "name": "PostgreSQL workers: duplicate deliveries, no faults",
        "detail": "inbox deliveries beyond the first, all six pg_workers drains",
        "measured": None,
        "target": 0.0,
        "comparison": "<=",
        "unit": "",
        "met": None,
        "reference": False,
        "cases": ["pg_workers"],
        "not_measured": "pg_workers not available: no server",
    }


def test_every_case_the_runner_runs_has_its_line() -> None:
    assert set(DESCRIBE) == {name for name, _ in (*CASES, *PG_CASES)} == set(RESULTS)
    for name, figures in RESULTS.items():
        assert describe(name, figures, RESULTS) == LINES[name], name
    assert describe("mystery", {"a": 1}, RESULTS) == '{"a": 1}'


def test_the_report_has_a_line_per_case_and_two_per_target() -> None:
    machine = {"cpus_usable": 2, "python": "3.11.7", "sqlite": "3.40.1", "postgresql": "16.2"}
    machine |= {"load_average_start": [0.5], "load_average_end": [1.25]}
    cases = {**RESULTS, "memory": {"available": True, "error": "BenchError: no /proc"}}
    targets = evaluate(cases, QUICK)
    report = {"mode": "quick", "duration_s": 61.4, "machine": machine, "cases": cases}
    lines = render(report, targets).splitlines()
    assert lines[0] == (
        "outbox relay benchmark, quick mode, 61s: 2 CPUs, Python 3.11.7, SQLite 3.40.1, "
        "PostgreSQL 16.2, load 0.50 -> 1.25"
    )
    listed = lines[3 : 3 + len(cases)]
    assert [line.split()[0] for line in listed] == list(cases)
    assert listed[0] == f"{'ceiling':<22} {LINES['ceiling']}"
    assert f"{'memory':<22} FAILED: BenchError: no /proc" in listed
    rows = lines[3 + len(cases) + 2 :]
    assert len(rows) == 2 * len(TABLE)
    assert rows[:2] == [
        f"{'one event per request vs ceiling':<52} {'0.27x':>10} {'>= 0.5x':>10}  missed",
        "    relay_single events/s / ceiling round trips/s (default: up to 8 in flight)",
    ]
    assert rows[34:36] == [
        f"{'peak RSS, big vs small backlog':<52} {'-':>10} {'<= 20MiB':>10}  not measured",
        "    MiB above: draining 10,000 minus draining 1,000 (memory failed: BenchError: no /proc)",
    ]

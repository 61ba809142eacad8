"""A handler of one's own next to the built-in warehouse: the relay and end to end,
on both backends.

The same orders go to a sink with the built-in registry (`python -m sink`: its
`order.placed` handler adds the quantity to the SKU's row of `inbox_inventory`) and
to one with bench.handlers:ONE_ROW (`--handlers`: one INSERT of a row of its own per
order); only the registry differs. Each case measures both in rounds that alternate
by registry: built-in, own, own, built-in (a full run: three of each, `--tiny`: one),
so a machine that speeds up or slows down weighs on both alike; each registry's rate
is its events over its time, and the targets take the own handler's over the
built-in's. After each round the sink's effects are checked: the inventory holds the
orders' quantities, or the own table one row per order.

- `relay_single_handler`, `relay_batch_handler` (and `pg_`): as `relay_single` and
  `relay_batch`, a backlog of orders (`handler_single_backlog`, or the larger
  `handler_batch_backlog`: batches drain several times faster) drained by the
  in-process relay into a fresh sink process per round (one event per request, or
  batches of 16; up to 8 in flight), with each process's CPU over the drain.
- `e2e_bulk_handler` (and `pg_`): two pipelines (sink and `publisher serve`) side by
  side for the whole case, one per registry, each warmed up; each round, 8 clients
  POST `handler_orders` orders in batches of 250 to one of them, timed until nothing
  is pending, with the CPU of its processes (as in bench.e2e). Bulk rather than one
  order per request: the sink's work per event is the same either way, and behind
  the bulk intake it is the largest share of an event's cost, so a handler that
  costs more shows most there (one order per request spends most of its time in the
  publisher's intake, which the registry does not change). With --profile, the first
  round of each registry is sampled.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from enum import StrEnum
from typing import Final

from bench import handlers
from bench.backlog import count_rows
from bench.cases import Context, Figures, relay_drain
from bench.e2e import (
    BULK_ANSWERED,
    BULK_BATCH,
    CLIENTS,
    Pipeline,
    batches_of,
    check_delivered,
    cpu_figures,
    pipeline,
    profiled,
    sessions,
    timed_round,
    warm_up,
)
from bench.events import Kind, order
from bench.generic import Spent, alternating
from bench.procs import BenchError
from chaos.dbs import Backend, DbLocation
from publisher.settings import DEFAULT_DEPTH

INVENTORY_TOTAL: Final = "SELECT coalesce(sum(qty), 0) FROM inbox_inventory"
ALTERNATING: Final = "alternating rounds by registry"  # how a case's registries are measured


class Registry(StrEnum):
    """Which handlers the sink runs."""

    BUILT_IN = "built_in"  # sink.handlers.WAREHOUSE, the default
    OWN = "own"  # bench.handlers.ONE_ROW

    @property
    def sink_args(self) -> tuple[str, ...]:
        return () if self is Registry.BUILT_IN else ("--handlers", handlers.SPEC)

    def effect(self, orders: int) -> int:
        """What `effect_of` reads once orders 0 to `orders` - 1 of a label are applied."""
        if self is Registry.BUILT_IN:
            return sum(order(n)["qty"] for n in range(orders))
        return orders

    def effect_of(self, sink_db: DbLocation) -> int:
        """The inventory's total quantity, or the number of rows of the own table."""
        query = INVENTORY_TOTAL if self is Registry.BUILT_IN else handlers.COUNT_ROWS
        return count_rows(sink_db, query)


REGISTRIES: Final = (Registry.BUILT_IN, Registry.OWN)


def check_effects(registry: Registry, expected: int) -> Callable[[DbLocation], None]:
    """A check of a sink's effects: `expected` of `registry.effect_of`, else BenchError."""

    def check(sink_db: DbLocation) -> None:
        found = registry.effect_of(sink_db)
        if found != expected:
            raise BenchError(f"the {registry} handlers' effect reads {found}, not {expected}")

    return check


def _common(ctx: Context, backend: Backend) -> Figures:
    turns = alternating(REGISTRIES, ctx.sizes.handler_rounds)
    return {
        "rounds_per_registry": ctx.sizes.handler_rounds,
        "order": ", ".join(turns),
        "registries": [registry.value for registry in REGISTRIES],
        "own_handler": handlers.SPEC,
        "backend": backend,
    }


# ---------------------------------------------------------------- the relay


async def _relay(ctx: Context, name: str, *, batch: bool, backend: Backend) -> Figures:
    sizes = ctx.sizes
    backlog = sizes.handler_batch_backlog if batch else sizes.handler_single_backlog
    drains: dict[Registry, list[Figures]] = {registry: [] for registry in REGISTRIES}
    each: list[float] = []  # every round's time, in the order they ran
    for number, registry in enumerate(alternating(REGISTRIES, sizes.handler_rounds)):
        drained = await relay_drain(
            ctx,
            f"{name}-{registry}-{number}",
            backlog,
            batch=batch,
            backend=backend,
            sink_args=registry.sink_args,
            check_sink=check_effects(registry, registry.effect(backlog)),
        )
        drains[registry].append(drained)
        each.append(drained["elapsed_s"])
    style = "batches of up to 16" if batch else "one event per request"
    return {
        **_common(ctx, backend),
        "backlog_per_round": backlog,
        "delivery": f"{style}, up to {DEFAULT_DEPTH} in flight",
        "pipeline": DEFAULT_DEPTH,
        "round_elapsed_s": each,
        **_drained_by_registry(drains),
    }


def _drained_by_registry(drains: dict[Registry, list[Figures]]) -> Figures:
    """Each registry's drains added up: its events over its time, its requests, and
    each process's CPU per event (us; the sink's is where the handlers differ)."""
    figures: Figures = {}
    for registry, its in drains.items():
        events = sum(drained["backlog"] for drained in its)
        elapsed = sum(drained["elapsed_s"] for drained in its)
        cpu: collections.Counter[str] = collections.Counter()
        for drained in its:
            cpu.update(drained["cpu_s"])
        figures[f"events_per_s_{registry}"] = events / elapsed
        figures[f"elapsed_s_{registry}"] = elapsed
        figures[f"requests_{registry}"] = sum(drained["requests"] for drained in its)
        figures[f"cpu_us_per_event_{registry}"] = {
            process: seconds * 1e6 / events for process, seconds in cpu.items()
        }
    return figures


async def relay_single_handler(ctx: Context) -> Figures:
    return await _relay(ctx, "single-handler", batch=False, backend="sqlite")


async def relay_batch_handler(ctx: Context) -> Figures:
    return await _relay(ctx, "batch-handler", batch=True, backend="sqlite")


async def pg_relay_single_handler(ctx: Context) -> Figures:
    return await _relay(ctx, "pg-single-handler", batch=False, backend="postgres")


async def pg_relay_batch_handler(ctx: Context) -> Figures:
    return await _relay(ctx, "pg-batch-handler", batch=True, backend="postgres")


# ---------------------------------------------------------------- end to end


async def _e2e(ctx: Context, case: str, *, backend: Backend) -> Figures:
    count, turns = ctx.sizes.handler_orders, alternating(REGISTRIES, ctx.sizes.handler_rounds)
    spent = {registry: Spent() for registry in REGISTRIES}
    profiles: Figures = {}
    each: list[float] = []  # every round's time, in the order they ran
    async with _pipelines(ctx, case, backend) as pipes, sessions() as clients:
        applied = {r: await warm_up(pipes[r], clients, bulk=True) for r in REGISTRIES}
        effects = {r: r.effect(applied[r]) for r in REGISTRIES}
        for number, registry in enumerate(turns):
            pipe = pipes[registry]
            bodies = batches_of(Kind.ORDER, f"r{number}", count)
            sampling: contextlib.AbstractAsyncContextManager[Figures] = (
                profiled(ctx, f"{case}_{registry}", backend, pipe)
                if number == turns.index(registry)  # a registry's first round
                else contextlib.nullcontext({})
            )
            async with sampling as seen:
                url = pipe.batch_url
                done = await timed_round(pipe, clients, url, bodies, BULK_ANSWERED, count)
            for process, summary in seen.get("profile", {}).items():
                profiles[f"{process} ({registry})"] = summary
            applied[registry] += count
            effects[registry] += registry.effect(count)
            check_delivered(pipe, applied[registry])
            check_effects(registry, effects[registry])(pipe.sink_db)
            spent[registry].add(done)
            each.append(done.elapsed_s)
    figures = {**_e2e_figures(ctx, backend, applied, spent), "round_elapsed_s": each}
    return {**figures, **({"profile": profiles} if profiles else {})}


def _e2e_figures(
    ctx: Context, backend: Backend, applied: dict[Registry, int], spent: dict[Registry, Spent]
) -> Figures:
    """The end-to-end case's figures: each registry's rate, intake rate and CPU."""
    count = ctx.sizes.handler_orders
    figures: Figures = {
        **_common(ctx, backend),
        "events_per_round": count,
        "route": f"POST /orders/batch, batches of {BULK_BATCH}",
        "batch": BULK_BATCH,
        "clients": CLIENTS,
        "applied_at_sink": {registry.value: applied[registry] for registry in REGISTRIES},
    }
    events = ctx.sizes.handler_rounds * count
    for registry, its in spent.items():
        figures[f"events_per_s_{registry}"] = events / its.elapsed_s
        figures[f"intake_per_s_{registry}"] = events / its.intake_s
        figures[f"elapsed_s_{registry}"] = its.elapsed_s
        figures[f"cpu_{registry}"] = cpu_figures(its.cpu_s, its.elapsed_s, events)
    return figures


@contextlib.asynccontextmanager
async def _pipelines(
    ctx: Context, case: str, backend: Backend
) -> AsyncIterator[dict[Registry, Pipeline]]:
    """A pipeline per registry, side by side on fresh databases, for the whole case."""
    async with contextlib.AsyncExitStack() as stack:
        pipes = {}
        for registry in REGISTRIES:
            name = f"{case.replace('_', '-')}-{registry}"
            made = pipeline(ctx, name, backend, registry.sink_args)
            pipes[registry] = await stack.enter_async_context(made)
        yield pipes


async def e2e_bulk_handler(ctx: Context) -> Figures:
    return await _e2e(ctx, "e2e_bulk_handler", backend="sqlite")


async def pg_e2e_bulk_handler(ctx: Context) -> Figures:
    return await _e2e(ctx, "e2e_bulk_handler", backend="postgres")

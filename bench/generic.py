"""Generic events next to orders: the relay and end-to-end paths, on both backends.

Each case measures one path with orders (`order.placed` events, as every other case
sends) and with generic events of 1 KiB of data (bench.events: integers only, and
with floats), in rounds that alternate by kind: order, generic, floats, floats,
generic, order (`--tiny`: one of each), so a machine that speeds up or slows down
during the case weighs on every kind alike. Each kind's rate is its events over its
time; the targets take the generic rate over the order rate of the same case.

- `relay_single_generic`, `relay_batch_generic` (and `pg_`): as `relay_single` and
  `relay_batch`, a backlog of `generic_backlog` entries of one kind, inserted
  directly, drained by the in-process relay into a fresh sink process (one event per
  request or batches of 16, up to 8 in flight), once per round.
- `e2e_single_generic`, `e2e_bulk_generic` (and `pg_`): one sink and one `publisher
  serve` for the whole case, warmed up with every kind; each round, 8 clients POST
  `e2e_orders` orders to /orders or events to /events, one per request (or in
  batches of 250 to /orders/batch, /events/batch), timed until nothing is pending;
  the CPU of every process (as in bench.e2e) is added up by kind. With --profile,
  the first round of each kind is sampled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

from bench.cases import Context, Figures, relay_drain
from bench.e2e import (
    ACCEPTED,
    BULK_ANSWERED,
    BULK_BATCH,
    CLIENTS,
    Round,
    batches_of,
    bodies_of,
    check_delivered,
    cpu_figures,
    pipeline,
    profiled,
    sessions,
    timed_round,
    warm_up,
)
from bench.events import DATA_BYTES, Kind
from chaos.dbs import Backend
from publisher.settings import DEFAULT_DEPTH

T = TypeVar("T")

KINDS: Final = (Kind.ORDER, Kind.GENERIC, Kind.FLOATS)
ALTERNATING: Final = "alternating rounds by kind"  # how a case's kinds are measured


def rounds(per_kind: int) -> list[Kind]:
    """The kinds in the order their rounds run: KINDS, then KINDS backwards, ..."""
    return alternating(KINDS, per_kind)


def alternating(variants: Sequence[T], per_variant: int) -> list[T]:
    """`per_variant` rounds of each variant, in the order they run: the variants, then
    the variants backwards, ... (a drift over the case weighs on each alike)."""
    backwards = variants[::-1]
    return [v for n in range(per_variant) for v in (variants if n % 2 == 0 else backwards)]


def _common(ctx: Context, backend: Backend) -> Figures:
    order = rounds(ctx.sizes.generic_rounds)
    return {
        "rounds_per_kind": ctx.sizes.generic_rounds,
        "order": ", ".join(order),
        "kinds": [kind.value for kind in KINDS],
        "data_bytes": DATA_BYTES,
        "backend": backend,
    }


# ---------------------------------------------------------------- the relay


async def _relay(ctx: Context, name: str, *, batch: bool, backend: Backend) -> Figures:
    backlog = ctx.sizes.generic_backlog
    elapsed, requests = dict.fromkeys(KINDS, 0.0), dict.fromkeys(KINDS, 0)
    for number, kind in enumerate(rounds(ctx.sizes.generic_rounds)):
        label = f"{name}-{kind}-{number}"
        drained = await relay_drain(ctx, label, backlog, batch=batch, kind=kind, backend=backend)
        elapsed[kind] += drained["elapsed_s"]
        requests[kind] += drained["requests"]
    style = "batches of up to 16" if batch else "one event per request"
    figures: Figures = {
        **_common(ctx, backend),
        "backlog_per_round": backlog,
        "delivery": f"{style}, up to {DEFAULT_DEPTH} in flight",
        "pipeline": DEFAULT_DEPTH,
    }
    events = ctx.sizes.generic_rounds * backlog
    for kind in KINDS:
        figures[f"events_per_s_{kind}"] = events / elapsed[kind]
        figures[f"elapsed_s_{kind}"] = elapsed[kind]
        figures[f"requests_{kind}"] = requests[kind]
    return figures


async def relay_single_generic(ctx: Context) -> Figures:
    return await _relay(ctx, "single-generic", batch=False, backend="sqlite")


async def relay_batch_generic(ctx: Context) -> Figures:
    return await _relay(ctx, "batch-generic", batch=True, backend="sqlite")


async def pg_relay_single_generic(ctx: Context) -> Figures:
    return await _relay(ctx, "pg-single-generic", batch=False, backend="postgres")


async def pg_relay_batch_generic(ctx: Context) -> Figures:
    return await _relay(ctx, "pg-batch-generic", batch=True, backend="postgres")


# ---------------------------------------------------------------- end to end


@dataclass
class Spent:
    """One kind's rounds added up: their spans, their intakes' and each process's CPU."""

    elapsed_s: float = 0.0
    intake_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)

    def add(self, done: Round) -> None:
        self.elapsed_s += done.elapsed_s
        self.intake_s += done.intake_s
        for name, seconds in done.cpu_s.items():
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + seconds


async def _e2e(ctx: Context, case: str, *, bulk: bool, backend: Backend) -> Figures:
    count, order = ctx.sizes.e2e_orders, rounds(ctx.sizes.generic_rounds)
    spent = {kind: Spent() for kind in KINDS}
    profiles: Figures = {}
    async with pipeline(ctx, case.replace("_", "-"), backend) as pipe, sessions() as clients:
        expected = 0
        for kind in KINDS:
            expected += await warm_up(pipe, clients, bulk=bulk, kind=kind)
        for number, kind in enumerate(order):
            label = f"r{number}-{kind.prefix}"
            bodies = batches_of(kind, label, count) if bulk else bodies_of(kind, label, count)
            url, expect = pipe.url_for(kind, bulk=bulk), BULK_ANSWERED if bulk else ACCEPTED
            sampling: contextlib.AbstractAsyncContextManager[Figures] = (
                profiled(ctx, f"{case}_{kind}", backend, pipe)
                if number == order.index(kind)  # a kind's first round
                else contextlib.nullcontext({})
            )
            async with sampling as seen:
                done = await timed_round(pipe, clients, url, bodies, expect, count)
            for process, summary in seen.get("profile", {}).items():
                profiles[f"{process} ({kind})"] = summary
            expected += count
            check_delivered(pipe, expected)
            spent[kind].add(done)
    figures: Figures = {
        **_common(ctx, backend),
        "events_per_round": count,
        "route": _ROUTES[bulk],
        "batch": BULK_BATCH if bulk else 1,
        "clients": CLIENTS,
        "applied_at_sink": expected,
    }
    events = ctx.sizes.generic_rounds * count
    for kind, its in spent.items():
        figures[f"events_per_s_{kind}"] = events / its.elapsed_s
        figures[f"intake_per_s_{kind}"] = events / its.intake_s
        figures[f"elapsed_s_{kind}"] = its.elapsed_s
        figures[f"cpu_{kind}"] = cpu_figures(its.cpu_s, its.elapsed_s, events)
    return {**figures, **({"profile": profiles} if profiles else {})}


_ROUTES: Final = {
    False: "POST /orders or POST /events, one per request",
    True: f"POST /orders/batch or POST /events/batch, batches of {BULK_BATCH}",
}


async def e2e_single_generic(ctx: Context) -> Figures:
    return await _e2e(ctx, "e2e_single_generic", bulk=False, backend="sqlite")


async def e2e_bulk_generic(ctx: Context) -> Figures:
    return await _e2e(ctx, "e2e_bulk_generic", bulk=True, backend="sqlite")


async def pg_e2e_single_generic(ctx: Context) -> Figures:
    return await _e2e(ctx, "e2e_single_generic", bulk=False, backend="postgres")


async def pg_e2e_bulk_generic(ctx: Context) -> Figures:
    return await _e2e(ctx, "e2e_bulk_generic", bulk=True, backend="postgres")

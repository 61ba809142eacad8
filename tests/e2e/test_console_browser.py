"""The operator console in a real browser: Debian's Chromium driven by Playwright
(the system browser, never one Playwright downloads), against a real `publisher
serve` process and a real sink process, with the databases read through connections
of the test's own.

The story: orders arrive and the overview counts them live; a poison head (a SKU the
sink refuses with 400) shows as blocked; an operator signs in, quarantines it with
a reason that is markup (shown as text, no dialog) and the later entries flow;
redrive puts it back. A POST without a session or without its CSRF token is refused
and changes nothing. With CONSOLE_SCREENSHOTS set to a folder (`make screenshots`),
the screenshots the README shows are written there too.

Events of any type: the entries table shows each one's type, key and a bounded view
of its data, the search filters by type and key, and data that is markup, control
characters or non-ASCII text is shown as escaped text, never run or rendered.

At a phone's width (390 px) no page scrolls sideways (wide tables scroll in their own
box); the delivery-rate chart has a time axis; the actions are enabled only for the
entry states they apply to; a pending entry's later stages show as waiting, not as
failures; the event page follows the entry live. A reply to a superseded entries
request never replaces the later one's.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK, http_request, post_order, serve_args, wait_until

from publisher.console.app import SECURITY_HEADERS
from publisher.console.sessions import MAX_SESSIONS
from publisher.console.stream import MAX_STREAMS, OPERATOR_STREAMS

if TYPE_CHECKING:
    from conftest import Databases, Query, StartPublisher, StartSink
    from playwright.sync_api import BrowserContext, Page, Route

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHROMIUM = shutil.which("chromium")
TOKEN = "console-operator-token-0123"
XSS = "<img src=x onerror=alert(1)>"
# A reason may hold what reorders or hides text; the page shows it as escapes.
REASON = f"{XSS} \u202eevil\u00ad"
REASON_SHOWN = f"{XSS} \\u202eevil\\u00ad"
POISON = {"id": "order-001", "sku": "poison", "qty": 1}
LATER = [{"id": f"order-00{n}", "sku": "snack", "qty": n} for n in range(2, 8)]
WAIT_MS = 10_000
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FAST_SERVE = ("--poll-interval", "0.2", "--retry-base", "0.05", "--retry-cap", "0.3")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """One headless Chromium per module, on a fresh profile of its own."""
    if CHROMIUM is None:
        why = "Debian's chromium is not installed (`make browser` installs it)"
        if os.environ.get("OUTBOX_REQUIRE_BROWSER"):  # set by CI: a failure, not a skip
            pytest.fail(why)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 820},
        )
        yield context
        context.close()


def shots(tmp_path: Path) -> list[Path]:
    folders = [tmp_path / "screenshots"]
    if os.environ.get("CONSOLE_SCREENSHOTS"):
        folders.append(Path(os.environ["CONSOLE_SCREENSHOTS"]))
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def screenshot(page: Page, folders: list[Path], name: str) -> None:
    for folder in folders:
        page.screenshot(path=str(folder / f"{name}.png"))


def entry_state(db_rows: Query, db: Path | str, event_id: str) -> tuple[bool, bool]:
    """(sent, quarantined) of one outbox entry, read with the test's own connection."""
    [(sent, quarantined)] = db_rows(
        db, "SELECT sent, quarantined FROM outbox_entries WHERE id = ?", (event_id,)
    )
    return bool(sent), bool(quarantined)


def records(db_rows: Query, db: Path | str) -> list[tuple[Any, ...]]:
    return db_rows(
        db, "SELECT id, reason, quarantined_by, released_by, released_as FROM outbox_quarantines"
    )


def post_unsigned(port: int, path: str) -> tuple[int, Any]:
    """A POST with no session cookie (the browser's is not sent): (status, JSON body)."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5.0)
    try:
        body = json.dumps({"reason": "no session"})
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


@pytest.mark.parametrize("databases", ["sqlite", "postgres"], indirect=True)
def test_the_operator_unblocks_a_poison_head_from_the_page(
    browser: BrowserContext,
    databases: Databases,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    db_rows: Query,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    folders = shots(tmp_path) if databases.backend == "sqlite" else [tmp_path / "pg"]
    sink = sink_process(databases.sink, "--chaos", "reject-sku=poison")
    token_file = tmp_path / "console-token"
    token_file.write_text(TOKEN)
    publisher = publisher_process(
        *serve_args(databases.source, sink.url, "--console-token-file", str(token_file)),
        *FAST_SERVE,
    )
    base = f"http://{LOOPBACK}:{publisher.port}"
    dialogs: list[str] = []
    page = browser.new_page()
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    reply = page.goto(f"{base}/console")
    assert reply is not None and reply.status == 200
    for name, value in SECURITY_HEADERS.items():
        assert reply.headers[name.lower()] == value
    expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    expect(page.locator("#pending")).to_have_text("0", timeout=WAIT_MS)

    # Live: each order shows up in the count without a reload.
    for count, event in enumerate([POISON, *LATER], start=1):
        assert post_order(publisher.port, event)[0] == 201
        expect(page.locator("#pending")).to_have_text(str(count), timeout=WAIT_MS)
    expect(page.locator("#head")).to_contain_text("order-001 BLOCKED", timeout=WAIT_MS)
    expect(page.locator("#head-detail")).to_contain_text("400", timeout=WAIT_MS)

    # One event: the evidence table, as `publisher trace` builds it.
    page.locator("#head a").click()
    expect(page.locator("#event-title")).to_have_text("Event order-001")
    stages = page.locator("#evidence tbody tr")
    expect(stages).to_have_count(5)
    expect(stages.nth(0)).to_contain_text("proven")
    # Not signed in: the sink's record is not shown while its token guards it (this sink
    # has none: once the service says so, the sink is asked, as below once signed in).
    expect(stages.nth(2)).to_contain_text(re.compile("sign in to see|not proven"))
    expect(page.get_by_role("button", name="Quarantine")).to_be_disabled()

    # Sign in, quarantine with a reason that is markup.
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_label("Operator").fill("alice")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#signed-in")).to_contain_text("Signed in as alice")
    # Signed in: the sink was asked, and has no row; the head fails, so not merely waiting.
    expect(stages.nth(2)).to_contain_text("not proven")
    expect(stages.nth(2)).to_contain_text("the sink's inbox has no row")
    expect(page.get_by_role("button", name="Quarantine")).to_be_enabled()
    expect(page.get_by_role("button", name="Redrive")).to_be_disabled()
    page.get_by_label("Reason").fill(REASON)
    # By keyboard: Enter in the reason asks, the question takes the focus on its harmless
    # answer, Escape withdraws it and gives the focus back; nothing is done meanwhile.
    page.get_by_label("Reason").press("Enter")
    expect(page.locator("#confirm")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#confirm")).to_be_hidden()
    expect(page.get_by_role("button", name="Quarantine")).to_be_focused()
    page.get_by_role("button", name="Quarantine").click()
    expect(page.locator("#confirm")).to_contain_text(XSS)
    assert entry_state(db_rows, databases.source, "order-001") == (False, False)  # asked first
    page.get_by_role("button", name="Confirm").click()
    expect(page.locator("#action-result")).to_have_text("quarantined order-001 by alice")
    expect(page.locator("#records tbody")).to_contain_text(REASON_SHOWN)
    assert page.locator("#records img").count() == 0
    assert entry_state(db_rows, databases.source, "order-001") == (False, True)
    assert records(db_rows, databases.source) == [("order-001", REASON, "alice", None, None)]
    expect(page.get_by_role("button", name="Quarantine")).to_be_disabled()
    expect(page.locator("#reason")).to_be_focused()  # its button is off now
    expect(page.get_by_role("button", name="Redrive")).to_be_enabled()
    for event in LATER:  # the line moves on past the quarantined head
        wait_until(lambda e=event: entry_state(db_rows, databases.source, e["id"])[0], 10.0)
    screenshot(page, folders, "actions")

    # Refused, nothing changed: a signed POST without the CSRF header, and no session.
    before = records(db_rows, databases.source), entry_state(db_rows, databases.source, "order-001")
    url = f"{base}/console/api/events/order-001/redrive"
    signed = page.request.post(url, data="{}", headers={"Content-Type": "application/json"})
    assert signed.status == 403 and "X-CSRF-Token" in signed.json()["error"]
    status, body = post_unsigned(publisher.port, "/console/api/events/order-001/quarantine")
    assert status == 403 and "sign in" in body["error"]
    after = records(db_rows, databases.source), entry_state(db_rows, databases.source, "order-001")
    assert after == before

    # Redrive puts it back in line.
    page.get_by_role("button", name="Redrive").click()
    page.get_by_role("button", name="Confirm").click()
    expect(page.locator("#action-result")).to_have_text("redriven order-001 by alice")
    expect(page.locator("#records tbody")).to_contain_text("redriven")
    assert entry_state(db_rows, databases.source, "order-001") == (False, False)
    assert records(db_rows, databases.source) == [
        ("order-001", REASON, "alice", "alice", "redriven")
    ]
    expect(page.get_by_role("button", name="Quarantine")).to_be_enabled()
    expect(page.get_by_role("button", name="Redrive")).to_be_disabled()
    screenshot(page, folders, "event")

    # Entries by state, and the search by event ID.
    page.get_by_role("link", name="Entries").click()
    page.get_by_label("State").select_option("sent")
    expect(page.locator("#entry-table tbody tr")).to_have_count(len(LATER), timeout=WAIT_MS)
    expect(page.locator("#entry-table tbody")).to_contain_text("order-007")
    screenshot(page, folders, "entries")
    page.get_by_label("Event ID").fill("order-001")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#entry-table tbody tr")).to_have_count(1)
    expect(page.locator("#entry-table tbody")).to_contain_text("pending")

    page.get_by_role("link", name="Overview").click()
    expect(page.locator("#quarantined")).to_have_text("0", timeout=WAIT_MS)
    expect(page.locator("#head")).to_contain_text("order-001 BLOCKED", timeout=WAIT_MS)
    expect(page.locator("#rate-caption")).to_contain_text(f"{len(LATER)} marked sent")
    screenshot(page, folders, "overview")
    assert dialogs == []  # the markup never ran
    page.close()


# ---------------------------------------------------------------- events of any type

HOSTILE_TEXT = "<script>document.title='pwned'</script>\u0007\u001b[31m\u202e\u00e9\U0001f600"
HOSTILE_SHOWN = (  # as escapedJson writes it: printable ASCII only
    "<script>document.title='pwned'</script>\\u0007\\u001b[31m\\u202e\\u00e9\\ud83d\\ude00"
)
GENERIC = [
    {"id": "pay-1", "type": "payment.captured", "key": "cust-1", "data": {"amount": 1250}},
    {"id": "pay-2", "type": "payment.captured", "key": "cust-2", "data": {"amount": 99}},
    {"id": "tick-1", "type": "clock.tick", "data": {"n": 1}},
    {"id": "note-1", "type": "note.added", "key": "cust-1", "data": {"text": HOSTILE_TEXT}},
    {"id": "big-1", "type": "note.added", "key": "cust-3", "data": {"text": "x" * 20_000}},
]
DATA_SHOWN_CHARS = 16 * 1024  # console.js


def search(page: Page, *, type: str = "", key: str = "") -> None:
    page.get_by_label("Type").fill(type)
    page.get_by_label("Key").fill(key)
    page.get_by_role("button", name="Search").click()


@pytest.mark.parametrize("databases", ["sqlite"], indirect=True)
def test_the_console_lists_and_filters_events_by_type_and_key_and_escapes_their_data(
    browser: BrowserContext,
    databases: Databases,
    publisher_process: StartPublisher,
) -> None:
    from playwright.sync_api import expect

    # No sink listens: every entry stays pending, in the order it was recorded.
    publisher = publisher_process(*serve_args(databases.source, f"http://{LOOPBACK}:9/events"))
    for event in GENERIC:
        assert http_request(publisher.port, "POST", "/events", event)[0] == 201
    assert post_order(publisher.port, {"id": "order-1", "sku": "snack", "qty": 2})[0] == 201
    dialogs: list[str] = []
    page = browser.new_page()
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(f"http://{LOOPBACK}:{publisher.port}/console#entries")
    rows = page.locator("#entry-table tbody tr")

    expect(rows).to_have_count(len(GENERIC) + 1, timeout=WAIT_MS)
    expect(page.locator("#entry-table thead")).to_contain_text("TypeKeyData")
    cells = [rows.nth(n).locator("td").all_inner_texts()[1:5] for n in (0, 1, 2, 5)]
    assert cells == [
        ["pay-1", "payment.captured", "cust-1", '{"amount":1250}'],
        ["pay-2", "payment.captured", "cust-2", '{"amount":99}'],
        ["tick-1", "clock.tick", "(none)", '{"n":1}'],
        ["order-1", "order.placed", "snack", '{"qty":2,"sku":"snack"}'],
    ]

    # Markup, control characters and non-ASCII text: escaped text, cut at 80 characters.
    note = rows.nth(3).locator("td").nth(4)
    expect(note).to_have_text(f'{{"text":"{HOSTILE_SHOWN}"}}'[:77] + "...")
    big = rows.nth(4).locator("td").nth(4).inner_text()
    assert len(big) == 80 and big.endswith("...")

    search(page, type="payment.captured")
    expect(rows).to_have_count(2)
    search(page, key="cust-1")
    expect(rows).to_have_count(2)
    expect(page.locator("#entry-table tbody")).to_contain_text("note-1")
    search(page, type="note.added", key="cust-1")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("note-1")
    search(page, key="*")  # the events without a key
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("tick-1")
    search(page, type="no.such.type")
    expect(page.locator("#entries-error")).to_have_text("No entries match.")
    search(page, type="bad type!")
    expect(page.locator("#entries-error")).to_contain_text("bad type")

    # One event: its type, its key and its data as indented JSON, escaped.
    page.goto(f"http://{LOOPBACK}:{publisher.port}/console#event/note-1")
    expect(page.locator("#event-type")).to_have_text("note.added")
    expect(page.locator("#event-key")).to_have_text("cust-1")
    expect(page.locator("#event-data")).to_have_text(f'{{\n  "text": "{HOSTILE_SHOWN}"\n}}')
    expect(page.locator("#event-data-note")).to_have_text("")
    page.goto(f"http://{LOOPBACK}:{publisher.port}/console#event/tick-1")
    expect(page.locator("#event-key")).to_have_text("(none)")
    expect(page.locator("#event-data")).to_have_text('{\n  "n": 1\n}')

    # Data over the bound is cut, and the page says so.
    page.goto(f"http://{LOOPBACK}:{publisher.port}/console#event/big-1")
    whole = len(json.dumps(GENERIC[4]["data"], indent=2))
    expect(page.locator("#event-data-note")).to_have_text(
        f"Cut: the first {DATA_SHOWN_CHARS:,} of {whole:,} characters are shown."
    )
    assert len(page.locator("#event-data").inner_text()) == DATA_SHOWN_CHARS

    assert page.locator("main script").count() == 0
    assert page.title() == "Outbox console"
    assert dialogs == []
    page.close()


# ---------------------------------------------------------------- issue 32: the page


def test_a_reply_to_a_superseded_entries_request_is_dropped(
    browser: BrowserContext, tmp_path: Path, publisher_process: StartPublisher
) -> None:
    """The page asks for pending entries, then (before that reply comes) for sent ones:
    the pending reply, arriving last, must not replace the sent one's."""
    from playwright.sync_api import expect

    publisher = publisher_process(
        *serve_args(tmp_path / "source.db", f"http://{LOOPBACK}:9/events")
    )
    for event in LATER:
        assert post_order(publisher.port, event)[0] == 201
    page = browser.new_page()
    held: list[Route] = []

    def hold_the_first(route: Route) -> None:
        if held:
            route.continue_()
        else:
            held.append(route)  # answered below, after the later request's reply

    page.route(re.compile(r"/console/api/entries\?state=pending"), hold_the_first)
    page.goto(f"http://{LOOPBACK}:{publisher.port}/console#entries")
    for _ in range(100):  # Playwright calls the handler while the page is waited on
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the page never asked for pending entries"
    page.get_by_label("State").select_option("sent")
    expect(page.locator("#entries-error")).to_have_text("No entries match.", timeout=WAIT_MS)
    with page.expect_response(re.compile(r"state=pending"), timeout=WAIT_MS):
        held[0].continue_()
    page.wait_for_timeout(500)  # ample for the page to handle a reply on loopback
    expect(page.locator("#entry-table tbody tr")).to_have_count(0)
    expect(page.locator("#entries-error")).to_have_text("No entries match.")
    page.close()


PHONE = {"width": 390, "height": 844}
RED = "rgb(179, 38, 30)"  # console.css: a failure
TIME_OF_DAY = re.compile(r"\d\d:\d\d:\d\dZ")


def fits_the_width(page: Page) -> bool:
    """Whether the page itself never scrolls sideways."""
    width = page.evaluate("document.documentElement.scrollWidth")
    return bool(width <= PHONE["width"])


def operator_quarantines(port: int, event_id: str, reason: str) -> None:
    """An operator on another page: sign in and quarantine, by HTTP alone."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5.0)
    try:
        json_body = {"Content-Type": "application/json"}
        conn.request("POST", "/console/api/sign-in", json.dumps({"token": TOKEN}), json_body)
        reply = conn.getresponse()
        csrf = json.loads(reply.read())["csrf_token"]
        cookie = reply.getheader("Set-Cookie", "").split(";")[0]
        headers = {**json_body, "Cookie": cookie, "X-CSRF-Token": csrf}
        path = f"/console/api/events/{event_id}/quarantine"
        conn.request("POST", path, json.dumps({"reason": reason}), headers)
        reply = conn.getresponse()
        assert reply.status == 200, reply.read()
    finally:
        conn.close()


@pytest.mark.parametrize("databases", ["sqlite"], indirect=True)
def test_the_console_at_a_phones_width_follows_an_event_live(
    browser: BrowserContext,
    databases: Databases,
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    db_rows: Query,
) -> None:
    from playwright.sync_api import expect

    folders = shots(tmp_path)
    source = databases.source
    sink = sink_process(databases.sink, "--chaos", "reject-sku=poison")
    token_file = tmp_path / "console-token"
    token_file.write_text(TOKEN)
    publisher = publisher_process(
        *serve_args(source, sink.url, "--console-token-file", str(token_file)), *FAST_SERVE
    )
    base = f"http://{LOOPBACK}:{publisher.port}/console"
    for event in [POISON, *LATER]:  # the poison head holds every later order back
        assert post_order(publisher.port, event)[0] == 201
    page = browser.new_page()
    page.set_viewport_size(PHONE)

    # The overview: the rate chart's time axis, in UTC, at the bars' edges.
    page.goto(base)
    expect(page.locator("#head")).to_contain_text("order-001 BLOCKED", timeout=WAIT_MS)
    ticks = page.locator("#rate-axis .tick")
    expect(ticks).to_have_count(6)
    for text in ticks.all_inner_texts():
        assert TIME_OF_DAY.fullmatch(text), text
    assert [ticks.nth(n).is_visible() for n in range(6)] == [True, False, True, True, False, True]
    boxes = [ticks.nth(n).bounding_box() for n in (0, 2, 3, 5)]
    for left, right in itertools.pairwise(boxes):  # the labels shown stand apart
        assert left is not None and right is not None
        assert left["x"] + left["width"] <= right["x"], (left, right)
    assert fits_the_width(page)
    screenshot(page, folders, "phone-overview")

    # An entry waiting behind the blocked head: its later stages wait, not in red.
    page.goto(f"{base}#event/order-002")
    stages = page.locator("#evidence tbody tr")
    expect(stages.nth(4)).to_contain_text("waiting", timeout=WAIT_MS)
    expect(stages.nth(3)).to_contain_text("waiting")
    assert stages.nth(4).locator("td").nth(2).evaluate("c => getComputedStyle(c).color") != RED
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#signed-in")).to_contain_text("Signed in as console")
    expect(stages.nth(2)).to_contain_text("waiting")  # the sink, asked now: no row yet
    expect(page.get_by_role("button", name="Quarantine")).to_be_enabled()  # pending
    expect(page.get_by_role("button", name="Redrive")).to_be_disabled()
    assert fits_the_width(page)

    # Another operator takes the head out of line: this page follows without a reload.
    page.evaluate("window.notReloaded = true")
    operator_quarantines(publisher.port, "order-001", "poison sku")
    expect(page.locator("#event-state")).to_contain_text("sent", timeout=WAIT_MS)
    for n in range(5):
        expect(stages.nth(n)).to_contain_text("proven")
        expect(stages.nth(n)).not_to_contain_text("not proven")
    expect(page.locator("#event-updated")).to_contain_text("Updated 20")
    assert page.evaluate("window.notReloaded") is True
    expect(page.get_by_role("button", name="Quarantine")).to_be_disabled()  # sent: neither
    expect(page.get_by_role("button", name="Redrive")).to_be_disabled()
    expect(page.locator("#actions-note")).to_contain_text("nothing to quarantine or redrive")
    assert db_rows(source, "SELECT sent FROM outbox_entries WHERE id = 'order-002'") == [(1,)]
    assert fits_the_width(page)
    screenshot(page, folders, "phone-event")

    # The entries table scrolls in its own box; the page does not.
    page.goto(f"{base}#entries")
    page.get_by_label("State").select_option("sent")
    expect(page.locator("#entry-table tbody tr")).to_have_count(len(LATER), timeout=WAIT_MS)
    box = page.locator("#entry-table").locator("..")
    assert box.evaluate("b => b.scrollWidth > b.clientWidth")
    assert fits_the_width(page)
    screenshot(page, folders, "phone-entries")
    page.close()


# ---------------------------------------------------------------- what the page may not claim


def sign_in_elsewhere(port: int) -> None:
    """Another operator signs in, by HTTP alone (a session of its own)."""
    status, body = http_request(port, "POST", "/console/api/sign-in", {"token": TOKEN})
    assert status == 200, body


def test_the_page_claims_nothing_it_could_not_read_and_shows_the_address_as_text(
    browser: BrowserContext, tmp_path: Path, publisher_process: StartPublisher
) -> None:
    """An address with a broken %-escape still gives a live page; an event that could
    not be read (unknown, or the database unavailable) shows its error and nothing of
    the event shown before, and is not said to be pruned; the address's text in the
    title is escaped and bounded, and a 128-character ID fits a phone; a refused
    search shows no rows of an earlier one; a session the service ended shows the
    sign-in form again."""
    from playwright.sync_api import expect

    token_file = tmp_path / "console-token"
    token_file.write_text(TOKEN)
    publisher = publisher_process(
        *serve_args(tmp_path / "source.db", f"http://{LOOPBACK}:9/events"),
        "--console-token-file",
        str(token_file),
        *FAST_SERVE,
    )
    long_id = "L" * 128
    for event in [GENERIC[0], {**GENERIC[2], "id": long_id}]:
        assert http_request(publisher.port, "POST", "/events", event)[0] == 201
    base = f"http://{LOOPBACK}:{publisher.port}/console"
    page = browser.new_page()
    page.goto(f"{base}#event/pay-1%")  # a link cut after its % sign
    expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    expect(page.locator("#pending")).to_have_text("2", timeout=WAIT_MS)
    expect(page.locator("#event-error")).to_contain_text("bad event ID")

    page.goto(f"{base}#event/pay-1")
    expect(page.locator("#attempts")).to_contain_text("last error", timeout=WAIT_MS)
    expect(page.locator("#event-lines")).to_contain_text("Line")
    page.goto(f"{base}#event/no-such-event")
    expect(page.locator("#event-error")).to_contain_text("no order or outbox entry")
    for shown in ("#event-state", "#attempts", "#event-lines", "#waiting"):
        expect(page.locator(shown)).to_have_text("")
    expect(page.locator("#evidence tbody tr")).to_have_count(0)

    unavailable = json.dumps({"error": "storage unavailable, try again"})
    page.route(
        re.compile(r"/console/api/events/"),
        lambda route: route.fulfill(status=503, body=unavailable, content_type="application/json"),
    )
    page.goto(f"{base}#event/pay-1")
    expect(page.locator("#event-error")).to_have_text("storage unavailable, try again")
    expect(page.locator("#event-state")).to_have_text("")
    page.unroute(re.compile(r"/console/api/events/"))

    page.goto(f"{base}#event/%E2%80%AEexe.txt")
    expect(page.locator("#event-title")).to_have_text("Event \\u202eexe.txt")
    page.goto(f"{base}#event/{'A' * 5000}")
    expect(page.locator("#event-title")).to_have_text(f"Event {'A' * 128}...")
    page.set_viewport_size(PHONE)
    page.goto(f"{base}#event/{long_id}")
    expect(page.locator("#event-state")).to_contain_text("pending", timeout=WAIT_MS)
    assert fits_the_width(page)
    page.set_viewport_size({"width": 1200, "height": 820})

    page.goto(f"{base}#entries")
    rows = page.locator("#entry-table tbody tr")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    search(page, key="bad key!")
    expect(page.locator("#entries-error")).to_contain_text("bad key")
    expect(rows).to_have_count(0)

    page.goto(f"{base}#event/pay-1")
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#signed-in")).to_be_visible()
    page.get_by_label("Reason").fill("looks \u202eright")
    page.get_by_role("button", name="Quarantine").click()
    expect(page.locator("#confirm-text")).to_contain_text('reason "looks \\u202eright"')
    page.get_by_role("button", name="Cancel").click()
    for _ in range(MAX_SESSIONS):  # newer sessions push this page's out
        sign_in_elsewhere(publisher.port)
    page.get_by_role("button", name="Sign out").click()
    expect(page.locator("#sign-in")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#signed-in")).to_be_hidden()
    page.close()


def test_a_page_refused_a_live_view_gets_one_once_there_is_room(
    browser: BrowserContext, tmp_path: Path, publisher_process: StartPublisher
) -> None:
    """The stream answers 503 beyond its bound; the browser's EventSource never tries
    again after an answer that is no stream, so the page must, or it stays dead."""
    from playwright.sync_api import expect

    publisher = publisher_process(
        *serve_args(tmp_path / "source.db", f"http://{LOOPBACK}:9/events")
    )
    held = []
    for _ in range(MAX_STREAMS - OPERATOR_STREAMS):  # every view kept for anonymous readers
        conn = http.client.HTTPConnection(LOOPBACK, publisher.port, timeout=5.0)
        conn.request("GET", "/console/api/stream")
        reply = conn.getresponse()
        assert reply.status == 200
        held.append(conn)
    page = browser.new_page()
    page.goto(f"http://{LOOPBACK}:{publisher.port}/console")
    expect(page.locator("#live")).to_contain_text("not live", timeout=WAIT_MS)
    for conn in held:
        conn.close()
    expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS + 5_000)
    expect(page.locator("#pending")).to_have_text("0")
    page.close()


def test_nothing_of_the_event_shown_before_stays_while_the_next_one_loads(
    browser: BrowserContext, tmp_path: Path, publisher_process: StartPublisher
) -> None:
    """Going from an event to another, the first one's state and actions are gone
    before the second one's answer comes (a database that is slow to answer takes up
    to its deadline): the page never shows one event's lines under another's title,
    nor offers to act on the second with the first one's state."""
    from playwright.sync_api import expect

    token_file = tmp_path / "console-token"
    token_file.write_text(TOKEN)
    publisher = publisher_process(
        *serve_args(tmp_path / "source.db", f"http://{LOOPBACK}:9/events"),
        "--console-token-file",
        str(token_file),
        *FAST_SERVE,
    )
    assert http_request(publisher.port, "POST", "/events", GENERIC[0])[0] == 201
    base = f"http://{LOOPBACK}:{publisher.port}/console"
    page = browser.new_page()
    page.goto(f"{base}#event/pay-1")
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#event-state")).to_contain_text("pending", timeout=WAIT_MS)
    expect(page.get_by_role("button", name="Quarantine")).to_be_enabled()

    held: list[Route] = []
    page.route(re.compile(r"/console/api/events/"), lambda route: held.append(route))
    page.goto(f"{base}#event/%E2%80%AE{'X' * 3000}")
    expect(page.locator("#event-title")).to_have_text(f"Event \\u202e{'X' * 127}...")
    for _ in range(100):  # its request is held: no answer comes
        if held:
            break
        page.wait_for_timeout(50)
    assert held
    expect(page.locator("#event-state")).to_have_text("")
    expect(page.locator("#attempts")).to_have_text("")
    expect(page.get_by_role("button", name="Quarantine")).to_be_disabled()
    page.get_by_label("Reason").fill("stale")
    page.get_by_label("Reason").press("Enter")
    expect(page.locator("#confirm")).to_be_hidden()
    unknown = json.dumps({"error": "no order or outbox entry with this ID"})
    for route in held:
        route.fulfill(status=404, body=unknown, content_type="application/json")
    page.unroute(re.compile(r"/console/api/events/"))
    expect(page.locator("#event-error")).to_contain_text("no order or outbox entry")
    page.close()

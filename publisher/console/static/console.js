// The operator console. Data is only ever put into the page as text (textContent,
// attributes of SVG shapes): nothing from the server is parsed as HTML.
"use strict";

const API = "/console/api";
const state = {
  session: null,
  view: null,
  eventId: null,
  entry: null,
  eventAskedAt: 0,
  page: { after: null, query: "" },
};
// Each view's latest request: a reply to an older one (the user chose again before it
// came) is dropped, so the page never shows what was asked before.
const asked = { entries: 0, event: 0 };
const EVENT_REFRESH_MS = 2000; // the event page reloads at most this often while live

const $ = (id) => document.getElementById(id);

// Text from outside (a sink's error, a reason) is shown with every character a reader
// would not see, or that would reorder what follows, written as an escape: controls,
// line and paragraph separators, lone surrogates, the interlinear annotation marks
// and every default ignorable code point (bidi overrides, zero widths, the soft
// hyphen, tag characters). The same set as the CLI and the logs escape.
const INVISIBLE = /[\p{Cc}\p{Cs}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}\u{fff9}-\u{fffb}]/gu;

function visible(text) {
  return String(text).replace(INVISIBLE, (c) => {
    const code = c.codePointAt(0).toString(16);
    return code.length <= 4 ? `\\u${code.padStart(4, "0")}` : `\\u{${code}}`;
  });
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = visible(text);
  if (className) node.className = className;
  return node;
}

function when(seconds) {
  return seconds === null || seconds === undefined ? "-" : new Date(seconds * 1000).toISOString();
}

// A time of day on the chart's axis, ISO 8601 in UTC as every time the page shows.
function clock(seconds) {
  return `${new Date(seconds * 1000).toISOString().slice(11, 19)}Z`;
}

function age(seconds) {
  return seconds < 60 ? `${seconds.toFixed(1)} s` : `${(seconds / 60).toFixed(1)} min`;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell);
    else td.textContent = cell === null || cell === undefined ? "-" : visible(cell);
    tr.appendChild(td);
  }
  return tr;
}

// Event data is anyone's JSON: it is shown as JSON text with every character outside
// printable ASCII written as \uXXXX (as `publisher list` does), so no control
// character, bidi override or look-alike letter changes what the operator reads.
const PREVIEW_CHARS = 80;
const DATA_SHOWN_CHARS = 16 * 1024;

// JSON.stringify writes a newline inside a string as \n: a raw newline is only the
// indentation's.
function escapedJson(value, indent) {
  return JSON.stringify(value, null, indent).replace(
    /[^\x20-\x7e\n]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

function dataPreview(data) {
  const text = escapedJson(data);
  return text.length <= PREVIEW_CHARS ? text : `${text.slice(0, PREVIEW_CHARS - 3)}...`;
}

// An ID from the address can be anything: at most 128 characters are shown.
function bounded(text) {
  return text.length <= 128 ? text : `${text.slice(0, 128)}...`;
}

function keyText(key) {
  return key === undefined || key === null ? "(none)" : key;
}

function eventLink(id) {
  const a = el("a", id);
  a.href = `#event/${encodeURIComponent(id)}`;
  return a;
}

async function call(method, path, body) {
  const headers = {};
  const init = { method, headers, credentials: "same-origin" };
  if (method === "POST") {
    headers["Content-Type"] = "application/json";
    if (state.session && state.session.csrf_token) headers["X-CSRF-Token"] = state.session.csrf_token;
    init.body = JSON.stringify(body || {});
  }
  const reply = await fetch(API + path, init);
  const data = await reply.json().catch(() => ({ error: `answer ${reply.status} is not JSON` }));
  if (!reply.ok) throw new Error(data.error || `answer ${reply.status}`);
  return data;
}

// ------------------------------------------------------------------ session

function showSession(session) {
  state.session = session;
  $("actions-off").hidden = session.actions_enabled;
  $("sign-in").hidden = !session.actions_enabled || session.signed_in;
  $("signed-in").hidden = !session.signed_in;
  $("operator-name").textContent = session.operator || "";
  showActions();
  // What the sink says about an event is shown to a signed-in operator only.
  if (state.view === "event") loadEvent(state.eventId);
}

// What each action applies to: quarantine takes a pending entry out of line, redrive
// puts a quarantined one back. The buttons follow the entry's state.
const ACTION_NOTES = {
  pending: "Quarantine takes this pending entry out of line.",
  quarantined: "Redrive puts this quarantined entry back in line at its own position.",
  sent: "This entry is sent: there is nothing to quarantine or redrive.",
};

function showActions() {
  const session = state.session;
  if (!session) return;
  const canAct = session.actions_enabled && session.signed_in;
  const entryState = state.entry ? state.entry.state : null;
  $("quarantine").disabled = !canAct || entryState !== "pending";
  $("redrive").disabled = !canAct || entryState !== "quarantined";
  if (!session.actions_enabled) {
    $("actions-note").textContent = "Actions are off: no operator token is configured.";
  } else if (!session.signed_in) {
    $("actions-note").textContent = "Sign in with the operator token to quarantine or redrive.";
  } else {
    const applies = ACTION_NOTES[entryState] || "No outbox entry: there is nothing to act on.";
    $("actions-note").textContent = `${applies} Actions are recorded as done by ${session.operator}.`;
  }
}

async function signIn(event) {
  event.preventDefault();
  $("account-error").textContent = "";
  try {
    showSession(await call("POST", "/sign-in", { token: $("token").value, operator: $("operator").value }));
    $("token").value = "";
    if (stream && stream.readyState === EventSource.CLOSED) live();
  } catch (error) {
    $("account-error").textContent = `Sign-in refused: ${visible(error.message)}`;
  }
}

async function signOut() {
  try {
    showSession(await call("POST", "/sign-out"));
  } catch (error) {
    $("account-error").textContent = visible(error.message);
    await refreshSession();
  }
}

// After a refusal: the service may have ended the session (a restart, its time up,
// pushed out by newer ones); the page then shows the sign-in form again.
async function refreshSession() {
  try {
    const session = await call("GET", "/session");
    if (state.session && state.session.signed_in && !session.signed_in) showSession(session);
  } catch (error) {
    // the service cannot be reached: the page keeps what it shows
  }
}

// ------------------------------------------------------------------ overview

function showOverview(o) {
  $("pending").textContent = String(o.pending);
  $("oldest").textContent = age(o.oldest_pending_age_seconds);
  $("quarantined").textContent = String(o.quarantined);
  const head = $("head");
  head.replaceChildren();
  const detail = $("head-detail");
  if (o.head === null) {
    head.textContent = "none";
    detail.hidden = true;
  } else {
    head.appendChild(eventLink(o.head.id));
    head.appendChild(document.createTextNode(o.head_blocked ? " BLOCKED" : " flowing"));
    head.classList.toggle("blocked", o.head_blocked);
    detail.hidden = !o.head_blocked;
    detail.textContent = o.head_blocked
      ? `Head ${o.head.id} blocked since ${when(o.head.blocked_since)}, ${o.head.attempts} ${o.head.attempts === 1 ? "attempt" : "attempts"}, last error: ${visible(o.head.last_error)}`
      : "";
  }
  const lanes = $("blocked-lanes");
  lanes.replaceChildren(
    ...o.blocked_lanes.map((lane) =>
      el("li", `Lane ${lane.lane}: head ${lane.id} blocked since ${when(lane.blocked_since)}, last error: ${lane.last_error}`, "blocked"),
    ),
  );
  const moreLanes = o.blocked_lanes_count - o.blocked_lanes.length;
  if (moreLanes > 0) {
    lanes.appendChild(el("li", `and ${moreLanes} more blocked lane(s): outbox-publisher status lists them all`, "blocked"));
  }
  drawRate(o.rate, o.taken_at);
  const moreLines = o.lines_held - o.lines.length;
  $("workers").textContent =
    `${o.workers.length} worker(s) holding leases: ${o.workers.join(", ") || "none"}; ${o.lines_free} line(s) free` +
    (moreLines > 0 ? `; ${o.lines_held} held, the first ${o.lines.length} listed` : "");
  $("lines").tBodies[0].replaceChildren(
    ...o.lines.map((l) => row([l.line, l.owner, l.epoch, `${l.expires_in_seconds.toFixed(1)} s`])),
  );
}

const SVG = "http://www.w3.org/2000/svg";

const AXIS_TICKS = 5; // spans between labels: console.css places .tick-0 to .tick-5

function drawRate(rate, takenAt) {
  const svg = $("rate");
  const counts = rate.sent;
  const most = Math.max(1, ...counts);
  const width = 600 / counts.length;
  const shapes = counts.map((count, n) => {
    const bar = document.createElementNS(SVG, "rect");
    const height = (count / most) * 110;
    bar.setAttribute("x", String(n * width + 1));
    bar.setAttribute("y", String(120 - height));
    bar.setAttribute("width", String(Math.max(1, width - 2)));
    bar.setAttribute("height", String(height));
    bar.setAttribute("class", "bar");
    const title = document.createElementNS(SVG, "title");
    title.textContent = `${count} marked sent`;
    bar.appendChild(title);
    return bar;
  });
  svg.replaceChildren(...shapes);
  const total = counts.reduce((a, b) => a + b, 0);
  const minutes = (counts.length * rate.interval_seconds) / 60;
  const last = counts[counts.length - 1] / rate.interval_seconds;
  $("rate-caption").textContent =
    `${total} marked sent in the last ${minutes} min, per ${rate.interval_seconds} s bar (highest ${most}); now ${last.toFixed(1)}/s`;
  // The last bar ends when the overview was read; the axis is the time (UTC) below it.
  const span = counts.length * rate.interval_seconds;
  const ticks = [];
  for (let n = 0; n <= AXIS_TICKS; n += 1) {
    ticks.push(el("span", clock(takenAt - span + (n * span) / AXIS_TICKS), `tick tick-${n}`));
  }
  $("rate-axis").replaceChildren(...ticks);
}

// A browser reconnects a stream that broke, but gives up for good on an answer that is
// no stream (503: too many live views, or a proxy's error page): the page then opens
// a new one after a while, and at once on sign-in (operators have views kept).
const LIVE_RETRY_MS = 5000;
let stream = null;

function live() {
  if (stream) stream.close();
  const source = new EventSource(`${API}/stream`);
  stream = source;
  source.addEventListener("open", () => { $("live").textContent = "live"; });
  source.addEventListener("overview", (message) => {
    $("live").textContent = "live";
    showOverview(JSON.parse(message.data));
    // The event page follows along: its entry and evidence, read again.
    if (state.view === "event" && Date.now() - state.eventAskedAt >= EVENT_REFRESH_MS) {
      loadEvent(state.eventId, true);
    }
  });
  source.addEventListener("unavailable", (message) => {
    $("live").textContent = visible(JSON.parse(message.data).error);
  });
  source.addEventListener("error", () => {
    if (source.readyState !== EventSource.CLOSED) {
      $("live").textContent = "reconnecting";
      return;
    }
    $("live").textContent = `not live: trying again in ${LIVE_RETRY_MS / 1000} s`;
    setTimeout(() => { if (stream === source) live(); }, LIVE_RETRY_MS);
  });
}

// ------------------------------------------------------------------ entries

function entriesQuery() {
  const query = new URLSearchParams({ state: $("state").value });
  const id = $("search-id").value.trim();
  const type = $("search-type").value.trim();
  const key = $("search-key").value.trim();
  if (id) query.set("id", id);
  if (type) query.set("type", type);
  if (key) query.set("key", key);
  return query;
}

// `after` null: the first page of the search in the form; else the next page of the
// search shown (whatever the form holds now).
async function loadEntries(after) {
  const mine = ++asked.entries;
  $("entries-error").textContent = "";
  const query = after === null ? entriesQuery() : new URLSearchParams(state.page.query);
  if (after !== null) query.set("after", String(after));
  try {
    const page = await call("GET", `/entries?${query}`);
    if (mine !== asked.entries) return; // superseded: a later choice's reply shows
    $("entry-table").tBodies[0].replaceChildren(
      ...page.entries.map((e) =>
        row([
          e.seq, eventLink(e.id), e.type, keyText(e.key), el("code", dataPreview(e.data)),
          e.state, e.attempts, e.last_error, when(e.queued_at),
        ]),
      ),
    );
    state.page.after = page.next_after;
    if (after === null) state.page.query = query.toString();
    $("next-page").disabled = page.next_after === null;
    if (page.entries.length === 0) $("entries-error").textContent = "No entries match.";
  } catch (error) {
    if (mine !== asked.entries) return;
    $("entries-error").textContent = visible(error.message);
    $("entry-table").tBodies[0].replaceChildren();
    $("next-page").disabled = true;
  }
}

// ------------------------------------------------------------------ one event

// `again`: a live reload of the event shown, which keeps what it shows if it fails.
async function loadEvent(id, again) {
  const mine = ++asked.event;
  state.eventAskedAt = Date.now();
  if (!again) {
    state.eventId = id;
    $("event-title").textContent = `Event ${visible(bounded(id))}`;
  }
  try {
    const data = await call("GET", `/events/${encodeURIComponent(id)}`);
    if (mine !== asked.event || id !== state.eventId) return; // superseded
    $("event-error").textContent = "";
    showEvent(data);
    $("event-updated").textContent = `Updated ${new Date().toISOString()}`;
  } catch (error) {
    if (mine !== asked.event || id !== state.eventId) return;
    $("event-error").textContent = visible(error.message);
    if (again) return;
    clearEvent();
  }
}

// Nothing shown of an event that could not be read (unknown, malformed, or the
// service or its database unavailable): its error says why, and no line of the
// event shown before stays.
function clearEvent() {
  state.entry = null;
  showActions();
  $("event-detail").hidden = true;
  $("event-state").textContent = "";
  $("event-updated").textContent = "";
  $("evidence").tBodies[0].replaceChildren();
  $("records").tBodies[0].replaceChildren();
  $("attempts").textContent = "";
  $("waiting").replaceChildren();
  $("event-lines").replaceChildren();
}

function showEntry(entry) {
  state.entry = entry;
  showActions();
  $("event-detail").hidden = entry === null;
  $("event-state").textContent = entry
    ? `seq ${entry.seq}, ${entry.state}`
    : "no outbox entry (pruned)";
  if (entry === null) return;
  $("event-type").textContent = entry.type;
  $("event-key").textContent = keyText(entry.key);
  const text = escapedJson(entry.data, 2);
  const cut = text.length > DATA_SHOWN_CHARS;
  $("event-data").textContent = cut ? text.slice(0, DATA_SHOWN_CHARS) : text;
  $("event-data-note").textContent = cut
    ? `Cut: the first ${DATA_SHOWN_CHARS.toLocaleString("en")} of ${text.length.toLocaleString("en")} characters are shown.`
    : "";
}

function showEvent(data) {
  const trace = data.trace;
  const entry = data.entry;
  showEntry(entry);
  // A stage not proven only because its entry is still pending waits: it is no fault.
  const waiting = new Set(data.waiting_stages || []);
  $("evidence").tBodies[0].replaceChildren(
    ...trace.stages.map((s, n) => {
      const shown = waiting.has(s.name) ? "waiting" : s.proof;
      const tr = row([n + 1, s.name, shown, s.evidence]);
      tr.className = `proof-${shown.replace(" ", "-")}`;
      if (waiting.has(s.name)) tr.title = "not proven yet: the entry is pending";
      return tr;
    }),
  );
  $("attempts").textContent = trace.attempts === null
    ? ""
    : `Attempts: ${trace.attempts}${trace.last_error ? `, last error: ${visible(trace.last_error)}` : ""}`;
  $("waiting").replaceChildren(...trace.waiting_behind.map((w) => el("li", `Waiting: ${w}`)));
  $("event-lines").replaceChildren(
    ...trace.lines.map((l) => el("li", `Line ${l.line}: owner ${l.owner || "none"}, epoch ${l.epoch}`)),
  );
  $("records").tBodies[0].replaceChildren(
    ...trace.quarantines.map((q) =>
      row([
        when(q.quarantined_at),
        q.quarantined_by,
        q.reason,
        q.released_at === null ? "still quarantined" : `${q.released_as} ${when(q.released_at)} by ${q.released_by}`,
        q.delivered_past_count === null ? "-" : `${q.delivered_past_count}: ${q.delivered_past.join(" ")}`,
      ]),
    ),
  );
}

// ------------------------------------------------------------------ actions

let pending = null;

function ask(action) {
  const reason = $("reason").value.trim();
  if (action === "quarantine" && !reason) {
    $("action-result").textContent = "Give a reason first.";
    return;
  }
  pending = { action, reason, opener: $(action) };
  $("confirm-text").textContent = action === "quarantine"
    ? `Quarantine ${visible(bounded(state.eventId))} with reason "${visible(reason)}"?`
    : `Redrive ${visible(bounded(state.eventId))}: put it back in line at its own position?`;
  $("confirm").hidden = false;
  $("confirm-no").focus(); // the keyboard lands in the question, on the harmless answer
}

// Focus back where the question came from, or on the reason once that button is off.
function refocus(opener) {
  (opener.disabled ? $("reason") : opener).focus();
}

function cancelled() {
  if (!pending) return;
  const { opener } = pending;
  $("confirm").hidden = true;
  pending = null;
  refocus(opener);
}

async function confirmed() {
  $("confirm").hidden = true;
  const { action, reason, opener } = pending;
  pending = null;
  const path = `/events/${encodeURIComponent(state.eventId)}/${action}`;
  try {
    const done = await call("POST", path, action === "quarantine" ? { reason } : {});
    $("action-result").textContent = `${done.result} ${done.id} by ${done.by}`;
    $("reason").value = "";
  } catch (error) {
    $("action-result").textContent = `Refused: ${visible(error.message)}`;
    await refreshSession();
  }
  await loadEvent(state.eventId, true);
  refocus(opener);
}

// ------------------------------------------------------------------ views

function decodedHash() {
  const hash = location.hash.slice(1);
  try {
    return decodeURIComponent(hash);
  } catch (error) {
    return hash; // a broken %-escape: as written (the service refuses such an ID)
  }
}

function route() {
  const hash = decodedHash();
  const view = hash.startsWith("event/") ? "event" : hash === "entries" ? "entries" : "overview";
  state.view = view;
  for (const name of ["overview", "entries", "event"]) $(name).hidden = name !== view;
  $("action-result").textContent = "";
  $("confirm").hidden = true;
  if (view === "event") {
    // Nothing of the event shown before stays while the next one loads: its lines
    // and its actions would be read as the next one's.
    clearEvent();
    $("event-error").textContent = "";
    loadEvent(hash.slice("event/".length));
  }
  if (view === "entries") loadEntries(null);
}

async function start() {
  $("sign-in").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("search").addEventListener("submit", (event) => { event.preventDefault(); loadEntries(null); });
  $("state").addEventListener("change", () => loadEntries(null));
  $("next-page").addEventListener("click", () => loadEntries(state.page.after));
  $("first-page").addEventListener("click", () => loadEntries(null));
  $("quarantine").addEventListener("click", () => ask("quarantine"));
  $("redrive").addEventListener("click", () => ask("redrive"));
  $("confirm-yes").addEventListener("click", confirmed);
  $("confirm-no").addEventListener("click", cancelled);
  $("confirm").addEventListener("keydown", (event) => { if (event.key === "Escape") cancelled(); });
  $("reason").addEventListener("keydown", (event) => {
    if (event.key !== "Enter") return;
    event.preventDefault();
    if (!$("quarantine").disabled) ask("quarantine");
  });
  window.addEventListener("hashchange", route);
  live();
  showSession(await call("GET", "/session"));
  route();
}

document.addEventListener("DOMContentLoaded", start);

// The Keyturn playground: plain ES module, no build step. Queries and mutations
// go over HTTP; subscriptions go through the vendored graphql-ws client.
import { createClient } from "./vendor/graphql-ws.js";

const STORE_LAST = "keyturn.playground.lastSubmission";
const STORE_SESSION = "keyturn.playground.session";
const STORE_TOKEN = "keyturn.playground.token";

function token() {
  return localStorage.getItem(STORE_TOKEN) || "";
}
const SESSION_PAGES = 10; // at most 10 × 100 sessions in the picker
const TIMELINE_ROWS = 300; // newest rows kept on the page

const SUBMIT = `mutation Submit($input: SubmitTurnInput!) {
  submitTurn(input: $input) {
    __typename
    ... on TurnAdmission { replayed turn { id status history input idempotencyKey output error } }
    ... on UserError { code message }
    ... on IdempotencyConflict { idempotencyKey existingTurnId }
    ... on SessionNotFound { sessionId }
    ... on InvalidInput { field }
  }
}`;
const SESSIONS = `query Sessions($after: String) {
  sessions(first: 100, after: $after) {
    edges { node { id createdAt defaultHistory eventCount } }
    pageInfo { hasNextPage endCursor }
  }
}`;
const SESSION = `query Session($id: ID!) {
  session(id: $id) { id createdAt defaultHistory eventCount }
}`;
const EVENT_COUNT = `query EventCount($id: ID!) { session(id: $id) { eventCount } }`;
const CREATE_SESSION = `mutation CreateSession($history: HistoryMode!) {
  createSession(input: { defaultHistory: $history }) { id createdAt defaultHistory eventCount }
}`;
const SESSION_EVENTS = `subscription SessionEvents($sessionId: ID!, $afterSeq: Int!) {
  sessionEvents(sessionId: $sessionId, afterSeq: $afterSeq) { seq type turnId data createdAt }
}`;
const CANCEL_TURN = `mutation CancelTurn($input: CancelTurnInput!) {
  cancelTurn(input: $input) {
    __typename
    ... on TurnCancellation { replayed turn { id status cancelRequested } }
    ... on UserError { code message }
  }
}`;
const DECIDE_TOOL_CALL = `mutation DecideToolCall($input: DecideToolCallInput!) {
  decideToolCall(input: $input) {
    __typename
    ... on ToolCallDecided { decision replayed turn { id status } }
    ... on ToolCallAlreadyDecided { decision }
    ... on UserError { code message }
  }
}`;
const TURN_COMPLETED = `subscription TurnCompleted($turnId: ID!) {
  turnCompleted(turnId: $turnId) { id status output error }
}`;

const EXAMPLES = `# Keyturn: example operations. Pick one from the run button's menu.
# The variables below name the session open in the playground and a fresh key.

mutation CreateSession {
  createSession(input: { defaultHistory: FULL }) { id defaultHistory eventCount }
}

# Run it twice: TurnAccepted, then TurnReplayed with the same turn.
# Change "input" and run again: IdempotencyConflict.
mutation Submit($sessionId: ID!, $key: String!, $input: String!) {
  submitTurn(input: { sessionId: $sessionId, idempotencyKey: $key, input: $input }) {
    __typename
    ... on TurnAdmission { replayed turn { id status output } }
    ... on UserError { code message }
    ... on IdempotencyConflict { existingTurnId }
  }
}

query Session($sessionId: ID!) {
  session(id: $sessionId) {
    eventCount
    events(first: 100) {
      edges { node { seq type turnId createdAt data } }
      pageInfo { hasNextPage endCursor }
    }
  }
}

subscription SessionEvents($sessionId: ID!) {
  sessionEvents(sessionId: $sessionId, afterSeq: 0) { seq type turnId createdAt }
}
`;

const STATUS_OF_EVENT = {
  "turn.started": "QUEUED",
  "turn.released": "QUEUED",
  "turn.running": "RUNNING",
  "turn.completed": "COMPLETED",
  "turn.failed": "FAILED",
  "turn.interrupted": "INTERRUPTED",
  "turn.cancelled": "CANCELLED",
  "tool.approval_requested": "WAITING",
  "tool.approved": "QUEUED",
  "tool.rejected": "QUEUED",
};
const ENDED = new Set(["COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED"]);
const KINDS = {
  TurnAccepted: ["accepted", "Accepted", "A new turn was admitted; its turn.started event is saved."],
  TurnReplayed: [
    "replayed",
    "Replayed",
    "This key already named this same request: the original turn, nothing new saved.",
  ],
  IdempotencyConflict: [
    "conflict",
    "Conflict",
    "This key already names a different request in this session: refused, nothing saved.",
  ],
  SessionNotFound: ["error", "Session not found", ""],
  InvalidInput: ["error", "Invalid input", ""],
};

const $ = (id) => document.getElementById(id);
const el = {
  sessionSelect: $("session-select"),
  refreshSessions: $("refresh-sessions"),
  createSession: $("create-session"),
  createSessionButton: $("create-session-button"),
  newSessionHistory: $("new-session-history"),
  sessionFacts: $("session-facts"),
  sessionId: $("session-id"),
  sessionDefault: $("session-default-history"),
  sessionCreated: $("session-created"),
  historyDefaultHint: $("history-default-hint"),
  submitForm: $("submit-form"),
  submitButton: $("submit-button"),
  key: $("idempotency-key"),
  newKey: $("new-key"),
  input: $("turn-input"),
  retry: $("retry-button"),
  conflict: $("conflict-button"),
  lastSummary: $("last-summary"),
  answer: $("answer"),
  eventCount: $("event-count"),
  eventDelta: $("event-delta"),
  timeline: $("timeline"),
  timelineEmpty: $("timeline-empty"),
  liveState: $("live-state"),
  tokenStatus: $("token-status"),
  graphiql: $("graphiql-link"),
};

const state = {
  session: null, // { id, createdAt, defaultHistory, eventCount }
  events: new Map(), // seq -> event, for the open session
  maxSeq: 0,
  serverCount: 0, // the session's eventCount, as last read from the server
  countBefore: null, // the count when the answered request was sent
  statuses: new Map(), // turnId -> latest status seen
  outputs: new Map(), // turnId -> its turn.delta texts so far, in seq order
  stopEvents: null,
  stopTurn: null,
  answerTurnId: null,
  busy: false,
};

// ---------------------------------------------------------------- transport

// Why a request got no data: "unreachable" (no answer at all), "no-token"
// (the server wants a token and none was sent), "token-refused" (one was sent
// and the server refused it).
class RequestProblem extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

async function gql(query, variables = {}) {
  const sent = token();
  let response;
  try {
    response = await fetch("graphql", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/json",
        ...(sent ? { authorization: `Bearer ${sent}` } : {}),
      },
      body: JSON.stringify({ query, variables }),
    });
  } catch {
    throw new RequestProblem(
      "unreachable",
      "The server did not answer: it may be down or restarting, or the answer was lost.",
    );
  }
  if (response.status === 401) {
    // The server says "missing or invalid API token" either way; what was sent tells which.
    document.getElementById("token-box").open = true;
    throw sent
      ? new RequestProblem(
          "token-refused",
          "Token refused: the server does not accept the API token kept in this browser. " +
            'Paste a valid one under "API token".',
        )
      : new RequestProblem(
          "no-token",
          'This server needs an API token and none is set: paste one under "API token".',
        );
  }
  const body = await response.json();
  if (body.errors && body.errors.length) {
    throw new Error(body.errors.map((e) => e.message).join("; "));
  }
  return body.data;
}

function wsUrl() {
  const url = new URL("graphql", window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}

function setLive(stateName) {
  el.liveState.dataset.state = stateName;
  el.liveState.textContent = `live: ${stateName}`;
}

const ws = createClient({
  url: wsUrl(),
  lazy: true,
  // Read at every (re)connect, so a token saved later is used.
  connectionParams: () => (token() ? { authorization: `Bearer ${token()}` } : {}),
  retryAttempts: 1000,
  shouldRetry: () => true,
  on: {
    connecting: () => setLive("connecting"),
    connected: () => setLive("connected"),
    // A normal close is the lazy client idling with no subscription open.
    closed: (event) => setLive(event && event.code === 1000 ? "idle" : "disconnected"),
  },
});

function subscribe(query, variables, onData) {
  return ws.subscribe(
    { query, variables },
    {
      next: (message) => {
        if (message.data) onData(message.data);
        if (message.errors) console.warn("subscription error", message.errors);
      },
      error: (error) => console.warn("subscription failed", error),
      complete: () => {},
    },
  );
}

// ------------------------------------------------------------------ helpers

function newKey() {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  return "key-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function short(id) {
  return id ? id.slice(0, 8) : "–";
}

function time(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const ms = String(d.getMilliseconds()).padStart(3, "0");
  return `${d.toLocaleTimeString([], { hour12: false })}.${ms}`;
}

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function loadLast() {
  try {
    return JSON.parse(localStorage.getItem(STORE_LAST) || "null");
  } catch {
    return null;
  }
}

function saveLast(last) {
  localStorage.setItem(STORE_LAST, JSON.stringify(last));
}

function setBusy(busy) {
  state.busy = busy;
  el.submitButton.disabled = busy;
  const last = loadLast();
  el.retry.disabled = busy || !last;
  el.conflict.disabled = busy || !last;
}

// ------------------------------------------------------------------ session

function sessionLabel(s) {
  const created = new Date(s.createdAt);
  const today = created.toDateString() === new Date().toDateString();
  const options = today
    ? { hour: "2-digit", minute: "2-digit" }
    : { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" };
  const when = Number.isNaN(created.getTime()) ? "" : ` · ${created.toLocaleString([], options)}`;
  return `${short(s.id)} · ${s.defaultHistory} · ${s.eventCount} events${when}`;
}

async function loadSessions() {
  const all = [];
  let after = null;
  for (let page = 0; page < SESSION_PAGES; page += 1) {
    const data = await gql(SESSIONS, { after });
    all.push(...data.sessions.edges.map((e) => e.node));
    if (!data.sessions.pageInfo.hasNextPage) break;
    after = data.sessions.pageInfo.endCursor;
  }
  all.reverse(); // newest first
  delete el.sessionSelect.dataset.problem;
  el.tokenStatus.textContent = "";
  const current = state.session && state.session.id;
  if (current && !all.some((s) => s.id === current)) all.unshift(state.session);
  el.sessionSelect.replaceChildren(
    ...(all.length
      ? all.map((s) => h("option", { value: s.id, selected: s.id === current }, sessionLabel(s)))
      : [h("option", { value: "" }, "No sessions yet: Submit creates one")]),
  );
  return all;
}

const PICKER_PROBLEM = {
  "no-token": "Needs an API token: none set",
  "token-refused": "Token refused: paste a valid one",
  unreachable: "Server unreachable: press Refresh to try again",
};

function showPickerProblem(error) {
  const text = PICKER_PROBLEM[error.kind] || `Could not load the sessions: ${error.message}`;
  el.sessionSelect.replaceChildren(h("option", { value: "" }, text));
  el.sessionSelect.dataset.problem = error.kind || "error";
  el.tokenStatus.textContent =
    error.kind === "no-token" || error.kind === "token-refused" ? error.message : "";
}

function showSession(s) {
  state.session = s;
  el.sessionFacts.hidden = !s;
  if (!s) {
    el.historyDefaultHint.textContent = "";
    renderCount();
    return;
  }
  el.sessionId.textContent = s.id;
  el.sessionDefault.textContent = s.defaultHistory;
  el.sessionCreated.textContent = new Date(s.createdAt).toLocaleString();
  el.historyDefaultHint.textContent = `(${s.defaultHistory})`;
  const option = [...el.sessionSelect.options].find((o) => o.value === s.id);
  if (option) option.textContent = sessionLabel({ ...s, eventCount: currentCount() });
  updateGraphiqlLink();
}

function clearAnswer() {
  if (state.stopTurn) state.stopTurn();
  state.stopTurn = null;
  state.answerTurnId = null;
  state.countBefore = null;
  el.answer.dataset.kind = "none";
  el.answer.dataset.typename = "";
  el.answer.replaceChildren(
    h("p", { class: "muted" }, "Submit a turn to see the server's answer here."),
  );
  el.eventDelta.textContent = "";
}

async function selectSession(id) {
  if (state.session && state.session.id !== id) clearAnswer();
  if (state.stopEvents) state.stopEvents();
  state.stopEvents = null;
  state.events.clear();
  state.outputs.clear();
  state.maxSeq = 0;
  state.serverCount = 0;
  el.timeline.replaceChildren();
  el.timelineEmpty.hidden = false;
  if (!id) {
    showSession(null);
    return;
  }
  const data = await gql(SESSION, { id });
  if (!data.session) {
    localStorage.removeItem(STORE_SESSION);
    showSession(null);
    return;
  }
  localStorage.setItem(STORE_SESSION, id);
  state.serverCount = data.session.eventCount;
  showSession(data.session);
  renderCount();
  el.sessionSelect.value = id;
  state.stopEvents = subscribe(SESSION_EVENTS, { sessionId: id, afterSeq: 0 }, (d) =>
    onEvent(id, d.sessionEvents),
  );
}

async function createSession(defaultHistory) {
  const data = await gql(CREATE_SESSION, { history: defaultHistory });
  const s = data.createSession;
  state.session = s;
  await loadSessions();
  await selectSession(s.id);
  return s;
}

// ------------------------------------------------------------------- events

// The one number for "events saved": the server's count, or the newest event
// seen live if that is further on. The counter and the answer's "Events saved"
// both show it.
function currentCount() {
  return Math.max(state.serverCount, state.maxSeq);
}

function renderCount() {
  const count = currentCount();
  el.eventCount.textContent = state.session ? String(count) : "–";
  el.eventCount.dataset.count = String(count);
  renderDelta();
}

function renderDelta() {
  const node = el.answer.querySelector("[data-role=delta]");
  const before = state.countBefore;
  if (before === null || !state.session) {
    el.eventDelta.textContent = "";
    return;
  }
  const now = currentCount();
  const delta = now - before;
  const types = [...state.events.values()]
    .filter((e) => e.seq > before)
    .sort((a, b) => a.seq - b.seq)
    .map((e) => e.type);
  const what = types.length === delta && delta > 0 ? ` (${types.join(", ")})` : "";
  el.eventDelta.textContent =
    delta === 0 ? "Since the last request: nothing new." : `Since the last request: +${delta}${what}.`;
  if (!node) return;
  node.dataset.delta = String(delta);
  node.replaceChildren(
    `${before} before the request, ${now} now: `,
    delta === 0 ? h("strong", {}, "nothing new") : h("strong", {}, `+${delta}`),
    what,
  );
}

function onEvent(sessionId, event) {
  if (!state.session || state.session.id !== sessionId) return;
  if (state.events.has(event.seq)) return; // a resubscription re-reads from the start
  state.events.set(event.seq, event);
  state.maxSeq = Math.max(state.maxSeq, event.seq);
  renderCount();
  el.timelineEmpty.hidden = true;

  const row = h(
    "li",
    { dataset: { seq: event.seq, type: event.type } },
    h(
      "details",
      {},
      h(
        "summary",
        { title: "Show the event's data" },
        h("span", { class: "seq" }, String(event.seq)),
        h("span", { class: `etype t-${event.type.replace(/\W/g, "-")}` }, event.type),
        h("span", { class: "turn mono", title: event.turnId || "" }, short(event.turnId)),
        h("time", { datetime: event.createdAt, title: event.createdAt }, time(event.createdAt)),
      ),
      h("pre", { class: "data" }, JSON.stringify(event.data, null, 2)),
    ),
  );
  if (event.type === "tool.approval_requested" && event.turnId) {
    row.append(decisionButtons(event.turnId, event.data.index));
  }
  if ((event.type === "tool.approved" || event.type === "tool.rejected") && event.turnId) {
    // The call is decided, here or elsewhere: its buttons have done their part.
    for (const box of el.timeline.querySelectorAll(".decision")) {
      if (box.dataset.turn !== event.turnId || box.dataset.index !== String(event.data.index)) continue;
      for (const b of box.querySelectorAll("button")) b.disabled = true;
      box.querySelector("[data-role=decision-state]").textContent =
        event.type === "tool.approved" ? "approved" : "rejected";
    }
  }
  // Newest on top; events arrive in seq order, but place by seq regardless.
  const next = [...el.timeline.children].find((li) => Number(li.dataset.seq) < event.seq);
  el.timeline.insertBefore(row, next || null);
  while (el.timeline.children.length > TIMELINE_ROWS) el.timeline.lastElementChild.remove();

  if (event.type === "turn.delta" && event.turnId) {
    // Index 0 starts a run afresh (a turn handed back and claimed again).
    const before = event.data.index === 0 ? "" : state.outputs.get(event.turnId) || "";
    state.outputs.set(event.turnId, before + event.data.text);
    // A turn that streams is running, whatever an earlier answer said.
    if (!ENDED.has(state.statuses.get(event.turnId))) state.statuses.set(event.turnId, "RUNNING");
    if (event.turnId === state.answerTurnId) {
      renderStatus();
      renderStreamed();
    }
  }

  const status = STATUS_OF_EVENT[event.type];
  if (event.turnId && status) {
    const before = state.statuses.get(event.turnId);
    if (!before || !ENDED.has(before)) state.statuses.set(event.turnId, status);
    if (event.turnId === state.answerTurnId) {
      renderStatus();
      const said = event.data && (event.data.output || event.data.error);
      if (said) showFinal(said);
    }
  }
  const option = [...el.sessionSelect.options].find((o) => o.value === sessionId);
  if (option) option.textContent = sessionLabel({ ...state.session, eventCount: currentCount() });
}

// ------------------------------------------------------------------- submit

async function refreshCount(sessionId) {
  const data = await gql(EVENT_COUNT, { id: sessionId });
  if (data.session && state.session && state.session.id === sessionId) {
    state.serverCount = data.session.eventCount;
    renderCount();
  }
  return currentCount();
}

function currentRequest() {
  const history = el.submitForm.elements.history.value;
  const request = {
    sessionId: state.session.id,
    idempotencyKey: el.key.value,
    input: el.input.value,
  };
  if (history) request.history = history;
  return request;
}

async function send(request, how) {
  setBusy(true);
  try {
    if (!state.session || state.session.id !== request.sessionId) {
      await selectSession(request.sessionId);
    }
    const before = await refreshCount(request.sessionId);
    renderPending(request);
    const data = await gql(SUBMIT, { input: request });
    const result = data.submitTurn;
    renderAnswer(result, { request, how, before });
    await refreshCount(request.sessionId);
    return result;
  } catch (error) {
    renderFailure(error, { request, how });
    return null;
  } finally {
    setBusy(false);
  }
}

async function onSubmit(event) {
  event.preventDefault();
  if (state.busy) return;
  if (!el.key.value.trim()) el.key.value = newKey();
  try {
    if (!state.session) await createSession(el.newSessionHistory.value);
  } catch (error) {
    renderFailure(error);
    return;
  }
  const request = currentRequest();
  // Kept before sending: if no answer comes back, Retry resends this very request.
  saveLast({ request, at: new Date().toISOString(), typename: null, turnId: null });
  renderLast();
  const result = await send(request, "submit");
  if (!result) return;
  const turn = result.turn;
  saveLast({
    request,
    at: new Date().toISOString(),
    typename: result.__typename,
    turnId: turn ? turn.id : null,
  });
  renderLast();
  // A new key for the next intended turn; the retry buttons keep the old one.
  if (result.__typename === "TurnAccepted") el.key.value = newKey();
}

async function onRetry() {
  const last = loadLast();
  if (!last || state.busy) return;
  const result = await send(last.request, "retry");
  if (result && result.turn && !last.turnId) {
    // The first try got no answer; this one names the turn.
    saveLast({ ...last, typename: result.__typename, turnId: result.turn.id });
    renderLast();
  }
}

async function onConflict() {
  const last = loadLast();
  if (!last || state.busy) return;
  const changed = { ...last.request, input: `${last.request.input} (changed)` };
  await send(changed, "changed");
}

function renderLast() {
  const last = loadLast();
  el.retry.disabled = state.busy || !last;
  el.conflict.disabled = state.busy || !last;
  if (!last) {
    el.lastSummary.textContent = "Nothing submitted from this browser yet.";
    return;
  }
  const r = last.request;
  el.lastSummary.replaceChildren(
    "Last submission, kept in this browser: key ",
    h("code", {}, r.idempotencyKey),
    ", input ",
    h("code", {}, JSON.stringify(r.input)),
    `, history ${r.history || "session default"}, session `,
    h("code", { title: r.sessionId }, short(r.sessionId)),
    last.turnId ? ", first answered with turn " : "",
    last.turnId ? h("code", { title: last.turnId }, short(last.turnId)) : "",
    ".",
  );
}

// ------------------------------------------------------------------- answer

function renderStatus() {
  const node = el.answer.querySelector("[data-role=status]");
  if (!node) return;
  const status = state.statuses.get(state.answerTurnId) || "";
  node.textContent = status;
  node.dataset.status = status;
  // Only a turn that has not ended can be cancelled.
  const cancel = el.answer.querySelector("[data-role=cancel]");
  if (cancel) cancel.hidden = ENDED.has(status);
}

// Cancel under one key per turn: a second click (or a lost answer's retry)
// replays the first cancel instead of asking again.
async function onCancel(turnId, button) {
  const note = el.answer.querySelector("[data-role=cancel-state]");
  button.disabled = true;
  try {
    const data = await gql(CANCEL_TURN, {
      input: { turnId, idempotencyKey: `cancel-${turnId}`, reason: "cancelled in the playground" },
    });
    const result = data.cancelTurn;
    if (state.answerTurnId !== turnId || !note) return;
    if (result.__typename === "TurnCancellation") {
      const seen = state.statuses.get(turnId);
      if (!seen || !ENDED.has(seen)) state.statuses.set(turnId, result.turn.status);
      note.textContent =
        result.turn.status === "CANCELLED" ? "cancelled" : "cancel requested: it stops at a safe point";
      renderStatus();
    } else {
      note.textContent = result.message || result.__typename;
      button.disabled = false;
    }
  } catch (error) {
    if (note) note.textContent = `cancel not sent: ${error.message}`;
    button.disabled = false;
  }
}

// Approve or Reject a call that waits, under one key per call and decision:
// a second click (or a lost answer's retry) replays the first decision.
function decisionButtons(turnId, index) {
  const note = h("span", { class: "muted", "data-role": "decision-state", role: "status" }, "");
  const decide = async (decision, buttons) => {
    for (const b of buttons) b.disabled = true;
    try {
      const data = await gql(DECIDE_TOOL_CALL, {
        input: {
          turnId,
          index,
          decision,
          idempotencyKey: `${decision.toLowerCase()}-${turnId}-${index}`,
          note: "decided in the playground",
        },
      });
      const result = data.decideToolCall;
      if (result.__typename === "ToolCallDecided" || result.__typename === "ToolCallAlreadyDecided") {
        note.textContent = result.decision === "APPROVE" ? "approved" : "rejected";
      } else {
        note.textContent = result.message || result.__typename;
        for (const b of buttons) b.disabled = false;
      }
    } catch (error) {
      note.textContent = `decision not sent: ${error.message}`;
      for (const b of buttons) b.disabled = false;
    }
  };
  const approve = h("button", { type: "button", "data-role": "approve" }, "Approve");
  const reject = h("button", { type: "button", class: "warn", "data-role": "reject" }, "Reject");
  approve.addEventListener("click", () => decide("APPROVE", [approve, reject]));
  reject.addEventListener("click", () => decide("REJECT", [approve, reject]));
  return h(
    "div",
    { class: "decision", dataset: { turn: turnId, index } },
    approve,
    " ",
    reject,
    " ",
    note,
  );
}

// The answer's output while its turn runs: the text its turn.delta events
// have brought so far, marked partial until the turn ends.
function renderStreamed() {
  const out = el.answer.querySelector("[data-role=output]");
  const streamed = state.outputs.get(state.answerTurnId);
  if (!out || !streamed || ENDED.has(state.statuses.get(state.answerTurnId))) return;
  out.textContent = streamed;
  out.dataset.partial = "true";
}

function showFinal(text) {
  const out = el.answer.querySelector("[data-role=output]");
  if (!out) return;
  out.textContent = text;
  delete out.dataset.partial;
}

function renderAnswer(result, { request, how, before }) {
  if (state.stopTurn) state.stopTurn();
  state.stopTurn = null;
  const typename = result.__typename;
  const [kind, title, blurb] = KINDS[typename] || ["error", typename, ""];
  const turn = result.turn || null;
  state.answerTurnId = turn ? turn.id : null;
  // The answer is a snapshot from when the mutation ran; the session's events
  // arrive in seq order and can overtake it (a call that waits for approval
  // may be on the timeline before submitTurn's QUEUED answer is). Every status
  // change is an event, so a status already seen from them is kept.
  if (turn && !state.statuses.has(turn.id)) state.statuses.set(turn.id, turn.status);
  const last = loadLast();
  const original = how === "retry" && last && last.turnId;
  state.countBefore = before;
  const howText = {
    submit: "Submitted",
    retry: "Retried the last submission",
    changed: "Same key, changed input",
  }[how];

  const rows = [];
  const fact = (label, ...value) => rows.push(h("dt", {}, label), h("dd", {}, ...value));
  if (turn) {
    fact("Turn", h("code", { "data-role": "turn-id" }, turn.id));
    if (original) {
      fact(
        "Same turn?",
        turn.id === original
          ? h("span", { class: "ok", "data-role": "same-turn" }, "yes, the turn first answered")
          : h("span", { class: "bad", "data-role": "same-turn" }, `no: first was ${short(original)}`),
      );
    }
    const cancel = h("button", { type: "button", class: "warn", "data-role": "cancel" }, "Cancel turn");
    cancel.addEventListener("click", () => onCancel(turn.id, cancel));
    fact(
      "Status",
      h("span", { class: "status", "data-role": "status" }, ""),
      " ",
      cancel,
      " ",
      h("span", { class: "muted", "data-role": "cancel-state", role: "status" }, ""),
    );
    fact("Key", h("code", {}, turn.idempotencyKey));
    fact("Input", h("code", {}, JSON.stringify(turn.input)), ` · history ${turn.history}`);
    fact("Output", h("span", { "data-role": "output" }, turn.output || turn.error || "…"));
  } else {
    if (result.message) fact("Message", result.message);
    if (result.existingTurnId) fact("Existing turn", h("code", {}, result.existingTurnId));
    fact("Key", h("code", {}, request.idempotencyKey));
    fact("Input sent", h("code", {}, JSON.stringify(request.input)));
  }
  fact("Events saved", h("span", { "data-role": "delta" }));

  el.answer.dataset.kind = kind;
  el.answer.dataset.typename = typename;
  const blurbNode = blurb ? h("p", { class: "blurb" }, blurb) : "";
  el.answer.replaceChildren(
    h(
      "div",
      { class: "answer-head" },
      h("span", { class: `badge ${kind}`, "data-role": "kind" }, title),
      h("code", { class: "typename", "data-role": "typename" }, typename),
      h("span", { class: "muted how" }, howText),
    ),
    blurbNode,
    h("dl", { class: "facts" }, rows),
  );
  renderStatus();
  renderDelta();
  showAnswerCard();

  // By the answer's own status, not the live one: a turn.completed event can
  // arrive before the answer that names the turn, and its output must still
  // reach this card (turnCompleted answers at once for an ended turn).
  if (turn && !ENDED.has(turn.status)) {
    const turnId = turn.id;
    state.stopTurn = subscribe(TURN_COMPLETED, { turnId }, (d) => {
      const done = d.turnCompleted;
      state.statuses.set(done.id, done.status);
      if (state.answerTurnId !== done.id) return;
      renderStatus();
      showFinal(done.output || done.error || "");
    });
    renderStreamed();
  }
}

function renderPending(request) {
  if (state.stopTurn) state.stopTurn();
  state.stopTurn = null;
  state.answerTurnId = null;
  state.countBefore = null;
  renderDelta();
  el.answer.dataset.kind = "pending";
  el.answer.dataset.typename = "";
  el.answer.replaceChildren(
    h("p", { class: "muted" }, "Sending with key ", h("code", {}, request.idempotencyKey), "…"),
  );
  showAnswerCard();
}

function renderFailure(error, { request, how } = {}) {
  state.countBefore = null;
  renderDelta();
  el.answer.dataset.kind = "error";
  el.answer.dataset.typename = "";
  const unreachable = error.kind === "unreachable";
  const title = unreachable ? "No answer from the server" : "Request failed";
  const parts = [
    h("div", { class: "answer-head" }, h("span", { class: "badge error" }, title)),
    h("p", { class: "blurb" }, String(error.message || error)),
  ];
  if (unreachable && request) {
    const again = {
      submit: "Submit",
      retry: "Retry last submission",
      changed: "Same key, changed input",
    }[how];
    parts.push(
      h(
        "p",
        { class: "blurb", "data-role": "safe-retry" },
        "The key ",
        h("code", {}, request.idempotencyKey),
        ` is kept in this browser, so pressing ${again} again is a safe retry: `,
        "if the first try did reach the server, the same key gets that turn back ",
        "(Replayed), never a second one.",
      ),
    );
  } else if (unreachable) {
    parts.push(h("p", { class: "blurb" }, "Nothing was submitted; try again once it is back."));
  }
  el.answer.replaceChildren(...parts);
  showAnswerCard();
}

// Bring the answer into view when it is off screen (on a phone it lies below
// the form); leave the page alone when it is already in sight.
function showAnswerCard() {
  const card = el.answer.closest("section");
  const box = card.getBoundingClientRect();
  const need = Math.min(box.height, window.innerHeight);
  if (box.top >= 0 && box.top + need <= window.innerHeight) return;
  const calm = window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  card.scrollIntoView({ block: "start", behavior: calm ? "auto" : "smooth" });
}

// -------------------------------------------------------------------- links

function updateGraphiqlLink() {
  const variables = {
    sessionId: state.session ? state.session.id : "paste a session id",
    key: newKey(),
    input: "hello",
  };
  // Strawberry's GraphiQL page reads the document from "q" and the variables from "variables".
  el.graphiql.href =
    "graphql?q=" +
    encodeURIComponent(EXAMPLES) +
    "&variables=" +
    encodeURIComponent(JSON.stringify(variables, null, 2));
}

// --------------------------------------------------------------------- init

async function init() {
  el.key.value = newKey();
  updateGraphiqlLink();
  renderLast();
  el.submitForm.addEventListener("submit", onSubmit);
  el.newKey.addEventListener("click", () => {
    el.key.value = newKey();
    el.key.focus();
  });
  el.retry.addEventListener("click", onRetry);
  el.conflict.addEventListener("click", onConflict);
  el.sessionSelect.addEventListener("change", () => selectSession(el.sessionSelect.value));
  el.refreshSessions.addEventListener("click", () => loadSessions().catch(showPickerProblem));
  el.createSession.addEventListener("submit", async (event) => {
    event.preventDefault();
    el.createSessionButton.disabled = true;
    try {
      await createSession(el.newSessionHistory.value);
    } catch (error) {
      renderFailure(error);
    } finally {
      el.createSessionButton.disabled = false;
    }
  });

  try {
    const last = loadLast();
    const remembered = localStorage.getItem(STORE_SESSION) || (last && last.request.sessionId);
    const sessions = await loadSessions();
    const pick = remembered || (sessions[0] && sessions[0].id) || "";
    await selectSession(pick);
    if (!state.session && sessions[0]) await selectSession(sessions[0].id);
  } catch (error) {
    showPickerProblem(error);
    renderFailure(error);
  }
  document.body.dataset.ready = "true";
}

init();

// ------------------------------------------------------------------ token

{
  const form = document.getElementById("token-form");
  const input = document.getElementById("api-token");
  input.value = token();
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (value) localStorage.setItem(STORE_TOKEN, value);
    else localStorage.removeItem(STORE_TOKEN);
    window.location.reload();
  });
}

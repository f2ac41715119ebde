// The GraphiQL page at GET /graphql, bundled by build.mjs into vendor/ so the
// page loads nothing from another host.
import { createGraphiQLFetcher } from "@graphiql/toolkit";
import { GraphiQL } from "graphiql";
import "graphiql/style.css";
import { createElement } from "react";
import { createRoot } from "react-dom/client";

// The playground keeps its API token under this key; the same origin shares
// localStorage, so a token saved there works here too.
const STORE_TOKEN = "keyturn.playground.token";

const EXAMPLES = `# Keyturn: example operations.
# Pick one from the run button's menu.
# 1. CreateSession; paste its id as "sessionId"
#    under Variables.
# 2. Submit; run it twice: TurnReplayed, same turn.
#    Change "input": IdempotencyConflict.
# 3. SessionEvents: what the turn wrote.
# 4. TurnCompleted, with the turn's id as "turnId".
# Server with API tokens? Save one in the playground
# (kept in this browser, used here too) or add
# {"Authorization": "Bearer <token>"} under Headers.

mutation CreateSession {
  createSession(input: { defaultHistory: FULL }) { id defaultHistory eventCount }
}

mutation Submit($sessionId: ID!, $key: String!, $input: String!) {
  submitTurn(input: { sessionId: $sessionId, idempotencyKey: $key, input: $input }) {
    __typename
    ... on TurnAdmission { replayed turn { id status output } }
    ... on UserError { code message }
    ... on IdempotencyConflict { existingTurnId }
  }
}

query SessionEvents($sessionId: ID!) {
  session(id: $sessionId) {
    eventCount
    events(first: 100) {
      edges { node { seq type turnId createdAt data } }
      pageInfo { hasNextPage endCursor }
    }
  }
}

# Over the WebSocket: the turn once it has ended.
subscription TurnCompleted($turnId: ID!) {
  turnCompleted(turnId: $turnId) { id status output error completedAt }
}
`;

function newKey() {
  // randomUUID exists only in secure contexts (https, localhost).
  if (globalThis.crypto && crypto.randomUUID) return crypto.randomUUID();
  return `key-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

const EXAMPLE_VARIABLES = JSON.stringify(
  {
    sessionId: "paste the id CreateSession returns",
    key: newKey(),
    input: "hello",
    turnId: "paste the turn id Submit returns",
  },
  null,
  2,
);

// The playground links here with ?q=…&variables=…; "q", because Strawberry
// runs a GET that carries "query" as an operation instead of showing this page.
const params = new URLSearchParams(location.search);
const linked = params.get("q") ?? params.get("query");

function stored(key) {
  try {
    return localStorage.getItem(key);
  } catch {
    return null; // storage disabled
  }
}

// Headers typed under Headers win; otherwise the stored token, read at every
// request so one saved later is used without a reload. For subscriptions the
// toolkit passes these headers as the connection_init payload, which is where
// the server looks for the token on a WebSocket.
function withToken(headers) {
  const given = headers || {};
  const token = stored(STORE_TOKEN);
  if (!token || Object.keys(given).some((name) => name.toLowerCase() === "authorization")) {
    return given;
  }
  return { ...given, authorization: `Bearer ${token}` };
}

// This page is served by the GraphQL endpoint itself.
const endpoint = new URL(location.pathname, location.href);
const socket = new URL(endpoint);
socket.protocol = endpoint.protocol === "https:" ? "wss:" : "ws:";

const toolkitFetcher = createGraphiQLFetcher({
  url: endpoint.href,
  subscriptionUrl: socket.href,
  // The server answers plain JSON; no multipart parsing needed.
  enableIncrementalDelivery: false,
});

function fetcher(graphQLParams, options) {
  return toolkitFetcher(graphQLParams, { ...options, headers: withToken(options?.headers) });
}

const props = { fetcher, defaultQuery: EXAMPLES, defaultEditorToolsVisibility: "variables" };
if (linked !== null) {
  props.query = linked;
  props.variables = params.get("variables") ?? "";
} else if (stored("graphiql:tabState") === null) {
  // A first visit: the examples with their variables (GraphiQL's own
  // defaultTabs would leave the variables editor empty). Later visits show
  // the tabs GraphiQL kept.
  props.query = EXAMPLES;
  props.variables = EXAMPLE_VARIABLES;
}

const root = document.getElementById("graphiql");
root.replaceChildren();
createRoot(root).render(createElement(GraphiQL, props));

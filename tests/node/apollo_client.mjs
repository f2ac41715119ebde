// Apollo Client 4 against Keyturn, as its documentation sets it up: HttpLink
// for queries and mutations, subscriptions over HTTP (multipart/mixed, the
// HttpLink default), and GraphQLWsLink (graphql-ws) split off for WebSockets.
// usage: node apollo_client.mjs http://host:port   (KEYTURN_TOKEN in the environment)
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { ApolloClient, ApolloLink, HttpLink, InMemoryCache, gql } from "@apollo/client";
import { PersistedQueryLink } from "@apollo/client/link/persisted-queries";
import { GraphQLWsLink } from "@apollo/client/link/subscriptions";
import { OperationTypeNode } from "graphql";
import { createClient } from "graphql-ws";
import WebSocket from "ws";

const [base] = process.argv.slice(2);
const authorization = `Bearer ${process.env.KEYTURN_TOKEN}`;
const timer = setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 60000);

const httpLink = new HttpLink({ uri: `${base}/graphql`, headers: { authorization } });
const wsLink = new GraphQLWsLink(
  createClient({
    url: `${base.replace(/^http/, "ws")}/graphql`,
    webSocketImpl: WebSocket,
    connectionParams: { authorization },
    retryAttempts: 0,
  }),
);
// Over HTTP only: subscriptions too go through HttpLink, as multipart/mixed.
const overHttp = new ApolloClient({ link: httpLink, cache: new InMemoryCache() });
// The usual production setup: subscriptions over WebSocket, the rest over HTTP.
const split = new ApolloClient({
  link: ApolloLink.split(
    ({ operationType }) => operationType === OperationTypeNode.SUBSCRIPTION,
    wsLink,
    httpLink,
  ),
  cache: new InMemoryCache(),
});

// Automatic persisted queries: a hash first, the text only when the server asks.
const persisted = new ApolloClient({
  link: new PersistedQueryLink({
    sha256: (text) => createHash("sha256").update(text).digest("hex"),
  }).concat(httpLink),
  cache: new InMemoryCache(),
});

const CREATE_SESSION = gql`
  mutation CreateSession {
    createSession {
      id
    }
  }
`;
const SUBMIT = gql`
  mutation Submit($input: SubmitTurnInput!) {
    submitTurn(input: $input) {
      __typename
      ... on TurnAccepted { turn { id status } }
      ... on TurnReplayed { turn { id status } }
    }
  }
`;
const TURN_COMPLETED = gql`
  subscription TurnCompleted($turnId: ID!) {
    turnCompleted(turnId: $turnId) { id status output }
  }
`;
const SESSION = gql`
  query Session($id: ID!) {
    session(id: $id) { id eventCount }
  }
`;

function first(client, query, variables) {
  return new Promise((resolve, reject) => {
    const subscription = client.subscribe({ query, variables }).subscribe({
      next: (result) => {
        if (result.error) reject(result.error);
        else {
          subscription.unsubscribe();
          resolve(result.data);
        }
      },
      error: reject,
    });
  });
}

const { data: created } = await overHttp.mutate({ mutation: CREATE_SESSION });
const sessionId = created.createSession.id;
const input = { sessionId, idempotencyKey: "apollo-1", input: "hello from Apollo" };

const { data: accepted } = await overHttp.mutate({ mutation: SUBMIT, variables: { input } });
assert.equal(accepted.submitTurn.__typename, "TurnAccepted");
const turnId = accepted.submitTurn.turn.id;

const overMultipart = await first(overHttp, TURN_COMPLETED, { turnId });
assert.equal(overMultipart.turnCompleted.id, turnId);
assert.equal(overMultipart.turnCompleted.status, "COMPLETED");

const { data: replayed } = await overHttp.mutate({ mutation: SUBMIT, variables: { input } });
assert.equal(replayed.submitTurn.__typename, "TurnReplayed");
assert.equal(replayed.submitTurn.turn.id, turnId);

const { data: session } = await overHttp.query({ query: SESSION, variables: { id: sessionId } });
assert.equal(session.session.eventCount, 4); // started, running, delta, completed: the replay wrote nothing

// The first time the server asks for the text (PersistedQueryNotFound), then knows the hash.
for (let i = 0; i < 2; i++) {
  const { data } = await persisted.query({
    query: SESSION,
    variables: { id: sessionId },
    fetchPolicy: "network-only",
  });
  assert.equal(data.session.eventCount, 4);
}

const overWebSocket = await first(split, TURN_COMPLETED, { turnId });
assert.equal(overWebSocket.turnCompleted.id, turnId);
assert.equal(overWebSocket.turnCompleted.status, "COMPLETED");

console.log(
  JSON.stringify({ sessionId, turnId, replayed: replayed.submitTurn.__typename, overMultipart, overWebSocket }),
);
clearTimeout(timer);
await wsLink.client.dispose();
process.exit(0);

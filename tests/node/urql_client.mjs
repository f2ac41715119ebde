// urql (@urql/core) against Keyturn, as its documentation sets it up:
// fetchExchange for queries and mutations, subscriptionExchange with graphql-ws.
// usage: node urql_client.mjs http://host:port   (KEYTURN_TOKEN in the environment)
import assert from "node:assert/strict";
import { Client, cacheExchange, fetchExchange, gql, subscriptionExchange } from "@urql/core";
import { createClient as createWSClient } from "graphql-ws";
import WebSocket from "ws";

const [base] = process.argv.slice(2);
const authorization = `Bearer ${process.env.KEYTURN_TOKEN}`;
const timer = setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 60000);

const wsClient = createWSClient({
  url: `${base.replace(/^http/, "ws")}/graphql`,
  webSocketImpl: WebSocket,
  connectionParams: { authorization },
  retryAttempts: 0,
});
const client = new Client({
  url: `${base}/graphql`,
  fetchOptions: { headers: { authorization } },
  exchanges: [
    cacheExchange,
    fetchExchange,
    subscriptionExchange({
      forwardSubscription(request) {
        const input = { ...request, query: request.query || "" };
        return {
          subscribe(sink) {
            const unsubscribe = wsClient.subscribe(input, sink);
            return { unsubscribe };
          },
        };
      },
    }),
  ],
});

const CREATE_SESSION = gql`
  mutation CreateSession {
    createSession { id }
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

function ok(result) {
  if (result.error) throw result.error;
  return result.data;
}

const created = ok(await client.mutation(CREATE_SESSION, {}).toPromise());
const sessionId = created.createSession.id;
const input = { sessionId, idempotencyKey: "urql-1", input: "hello from urql" };

const accepted = ok(await client.mutation(SUBMIT, { input }).toPromise());
assert.equal(accepted.submitTurn.__typename, "TurnAccepted");
const turnId = accepted.submitTurn.turn.id;

const completed = await new Promise((resolve, reject) => {
  const { unsubscribe } = client.subscription(TURN_COMPLETED, { turnId }).subscribe((result) => {
    if (result.error) reject(result.error);
    else if (result.data) {
      unsubscribe();
      resolve(result.data);
    }
  });
});
assert.equal(completed.turnCompleted.id, turnId);
assert.equal(completed.turnCompleted.status, "COMPLETED");

const replayed = ok(await client.mutation(SUBMIT, { input }).toPromise());
assert.equal(replayed.submitTurn.__typename, "TurnReplayed");
assert.equal(replayed.submitTurn.turn.id, turnId);

const session = ok(
  await client.query(SESSION, { id: sessionId }, { requestPolicy: "network-only" }).toPromise(),
);
assert.equal(session.session.eventCount, 4); // started, running, delta, completed

console.log(JSON.stringify({ sessionId, turnId, replayed: replayed.submitTurn.__typename, completed }));
clearTimeout(timer);
await wsClient.dispose();
process.exit(0);

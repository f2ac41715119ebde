// graphql-request against Keyturn, as its documentation shows: a query, a
// mutation, and a variables mistake that comes back as a ClientError.
// usage: node graphql_request.mjs http://host:port   (KEYTURN_TOKEN in the environment)
import assert from "node:assert/strict";
import { ClientError, GraphQLClient, gql } from "graphql-request";

const [base] = process.argv.slice(2);
const client = new GraphQLClient(`${base}/graphql`, {
  headers: { authorization: `Bearer ${process.env.KEYTURN_TOKEN}` },
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
      ... on TurnAccepted { turn { id } }
      ... on TurnReplayed { turn { id } }
    }
  }
`;
const SESSION = gql`
  query Session($id: ID!) {
    session(id: $id) { id eventCount }
  }
`;

const { createSession } = await client.request(CREATE_SESSION);
const sessionId = createSession.id;
const input = { sessionId, idempotencyKey: "gr-1", input: "hello from graphql-request" };

const accepted = await client.request(SUBMIT, { input });
assert.equal(accepted.submitTurn.__typename, "TurnAccepted");
const replayed = await client.request(SUBMIT, { input });
assert.equal(replayed.submitTurn.__typename, "TurnReplayed");
assert.equal(replayed.submitTurn.turn.id, accepted.submitTurn.turn.id);

const { session } = await client.request(SESSION, { id: sessionId });
assert.equal(session.id, sessionId);

// A mistake in the variables: idempotencyKey is missing.
let mistake;
try {
  await client.request(SUBMIT, { input: { sessionId, input: "no key" } });
  assert.fail("a variables mistake was accepted");
} catch (error) {
  assert.ok(error instanceof ClientError, String(error));
  mistake = { status: error.response.status, errors: error.response.errors };
}
assert.equal(mistake.status, 400);
assert.equal(mistake.errors.length, 1);
assert.match(mistake.errors[0].message, /^Variable '\$input' has invalid value/);
assert.match(mistake.errors[0].message, /idempotencyKey/);
assert.equal(mistake.errors[0].extensions.code, "BAD_USER_INPUT");

console.log(
  JSON.stringify({ sessionId, turnId: accepted.submitTurn.turn.id, replayed: replayed.submitTurn.__typename, mistake }),
);

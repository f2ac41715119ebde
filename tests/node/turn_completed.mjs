// Subscribes to turnCompleted with the graphql-ws client and prints what arrives as JSON.
// usage: node turn_completed.mjs ws://host:port/graphql TURN_ID
import { createClient } from "graphql-ws";
import WebSocket from "ws";

const [url, turnId] = process.argv.slice(2);
const client = createClient({ url, webSocketImpl: WebSocket, retryAttempts: 0 });
const received = [];
const timer = setTimeout(() => {
  console.error("timed out waiting for turnCompleted");
  process.exit(2);
}, 30000);

client.subscribe(
  {
    query: "subscription($t: ID!) { turnCompleted(turnId: $t) { id status output owner } }",
    variables: { t: turnId },
  },
  {
    next: (value) => received.push(value),
    error: (err) => {
      console.error(JSON.stringify(err));
      process.exit(1);
    },
    complete: async () => {
      clearTimeout(timer);
      console.log(JSON.stringify(received));
      await client.dispose();
      process.exit(0);
    },
  },
);

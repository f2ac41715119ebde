// Operations as a Relay app would write them; the compiler checks them
// against schema.graphql (the imports are not resolved).
import { graphql } from "react-relay";

export const sessionQuery = graphql`
  query SessionViewQuery($id: ID!) {
    session(id: $id) {
      id
      eventCount
      defaultHistory
      ...SessionView_turns
      ...SessionView_latestEvents
    }
  }
`;

// Any object by its id, as Relay's store refetches it.
export const nodeQuery = graphql`
  query SessionViewNodeQuery($id: ID!) {
    node(id: $id) {
      id
      ... on Turn {
        status
      }
    }
  }
`;

// Forward paging, refetched through Query.node (needs Session to be a Node).
export const turnsFragment = graphql`
  fragment SessionView_turns on Session
  @refetchable(queryName: "SessionViewTurnsPaginationQuery")
  @argumentDefinitions(count: { type: "Int", defaultValue: 10 }, cursor: { type: "String" }) {
    turns(first: $count, after: $cursor) @connection(key: "SessionView_turns") {
      edges {
        node {
          id
          status
          input
          output
        }
      }
    }
  }
`;

// The latest events, paging backwards.
export const latestEventsFragment = graphql`
  fragment SessionView_latestEvents on Session
  @refetchable(queryName: "SessionViewLatestEventsPaginationQuery")
  @argumentDefinitions(count: { type: "Int", defaultValue: 20 }, cursor: { type: "String" }) {
    events(last: $count, before: $cursor) @connection(key: "SessionView_events") {
      edges {
        node {
          id
          seq
          type
          data
        }
      }
    }
  }
`;

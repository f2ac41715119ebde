import { graphql } from "react-relay";

export const submitTurn = graphql`
  mutation SubmitTurnMutation($input: SubmitTurnInput!) {
    submitTurn(input: $input) {
      __typename
      ... on TurnAdmission {
        replayed
        turn {
          id
          status
        }
      }
      ... on UserError {
        code
        message
      }
    }
  }
`;

export const turnCompleted = graphql`
  subscription SubmitTurnCompletedSubscription($turnId: ID!) {
    turnCompleted(turnId: $turnId) {
      id
      status
      output
    }
  }
`;

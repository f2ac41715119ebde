"""GraphQL over HTTP as every mainstream client speaks it, on Strawberry's view.

- Media types and status codes of the graphql-over-http draft
  (keyturn.http.media): ``application/graphql-response+json`` answers 400
  without ``data`` for a request that never reached execution.
- Queries over GET (``query``, ``variables``, ``extensions`` in the URL); a
  mutation over GET is 405 with ``Allow: POST``, so GET never changes anything.
- Subscriptions stream over ``multipart/mixed;subscriptionSpec=1.0`` (Apollo's
  protocol); without that Accept a subscription is a 400 that says how to
  subscribe, rather than an execution that cannot return anything.
- Persisted documents (keyturn.http.persisted), on HTTP and WebSocket alike.
- Every refusal is a GraphQL error body (``extensions.code``), never plain text.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from json import JSONDecodeError
from typing import Any, cast

from cross_web import AsyncHTTPRequestAdapter, HTTPException
from graphql import GraphQLError
from graphql import OperationType as CoreOperation
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnected, WebSocketState
from strawberry.asgi import ASGIWebSocketAdapter, GraphQL
from strawberry.exceptions import MissingQueryError
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.http.exceptions import NonJsonMessageReceived, NonTextMessageReceived
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
    Operation,
)
from strawberry.subscriptions.protocols.graphql_transport_ws.types import (
    ConnectionInitMessage,
    ErrorMessage,
    Message,
    SubscribeMessage,
)
from strawberry.types import ExecutionResult
from strawberry.types.graphql import OperationType

from keyturn.db.tenancy import counted
from keyturn.http import memory
from keyturn.http.body import read_body, replaying
from keyturn.http.fairness import BUSY_ERROR, Shares
from keyturn.http.media import GRAPHQL_RESPONSE, JSON, is_ide_request, response_media_type
from keyturn.http.persisted import PersistedDocumentError, PersistedDocuments
from keyturn.logs import REQUEST_ID
from keyturn.resolvers.context import Context
from keyturn.schema import KeyturnSchema, operation_type

HOW_TO_SUBSCRIBE = (
    "a subscription needs a stream: open a WebSocket to /graphql (subprotocol "
    "graphql-transport-ws), or POST with Accept: multipart/mixed;subscriptionSpec=1.0"
)
# Where on_ws_connect leaves the close code and reason a connection is refused
# with, for the close frame.
WS_REFUSAL = "keyturn.ws_refusal"
# RFC 6455's registered code for a server that cannot serve now: a client
# (graphql-ws's among them) reconnects later, where 4403 tells it to give up.
TRY_AGAIN_LATER = 1013

_CODES = {400: "BAD_REQUEST", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}


class Refused(Exception):
    """A request answered with a status and a GraphQL error before it runs."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"errors": [{"message": message, "extensions": {"code": code, "retryable": False}}]}


def _is_refusal(media: str, answer: object) -> bool:
    """The draft: an answer without ``data`` (a request that never reached
    execution) is a 400 in application/graphql-response+json."""
    return media == GRAPHQL_RESPONSE and isinstance(answer, dict) and "data" not in answer


def _is_request_error(result: ExecutionResult) -> bool:
    # Nothing ran: parse and validation errors, variables that do not coerce.
    # Errors raised while executing carry the path of their field.
    errors = result.errors or []
    return result.data is None and bool(errors) and all(e.path is None for e in errors)


class _Messages:
    """The connection's messages, decoded, as Strawberry's ``iter_json``
    yields them (the same exceptions at the same messages, the end at the
    client's close or once the application has closed), and each message's
    size noted for keyturn.http.memory.

    Not an async generator reading through ``receive_text``: a connection
    waits in here for as long as it is open, and those are two frames (and
    the text of the message last read, the subscribe message of an idle
    subscription) where this is one."""

    __slots__ = ("_done", "_ignore_parsing_errors", "_view", "_ws")

    def __init__(self, view: Any, ws: WebSocket, ignore_parsing_errors: bool) -> None:
        self._view = view
        self._ws = ws
        self._ignore_parsing_errors = ignore_parsing_errors
        self._done = False

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> object:
        ws = self._ws
        while not self._done and ws.application_state != WebSocketState.DISCONNECTED:
            if ws.application_state != WebSocketState.CONNECTED:
                raise WebSocketDisconnected(
                    'WebSocket is not connected. Need to call "accept" first.'
                )
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            memory.note_received(ws.scope, len(message.get("text") or message.get("bytes") or ""))
            try:
                text = message["text"]
            except KeyError as error:
                raise NonTextMessageReceived from error
            try:
                return self._view.decode_json(text)
            except JSONDecodeError as error:
                if not self._ignore_parsing_errors:
                    raise NonJsonMessageReceived from error
        self._done = True
        raise StopAsyncIteration


class _WebSocketAdapter(ASGIWebSocketAdapter):
    def iter_json(self, *, ignore_parsing_errors: bool = False) -> _Messages:  # type: ignore[override]
        return _Messages(self.view, self.ws, ignore_parsing_errors)

    async def close(self, code: int, reason: str) -> None:
        # Strawberry closes a refused connection_init with 4403 "Forbidden";
        # say why when we know (a token without its Bearer scheme, say), or
        # that the token could not be checked at all (TRY_AGAIN_LATER).
        if code == 4403:
            code, reason = self.ws.scope.get("state", {}).pop(WS_REFUSAL, (code, reason))
        await super().close(code, reason)


class _TransportWS(BaseGraphQLTransportWSHandler[Context, None]):
    async def handle_subscribe(self, message: SubscribeMessage) -> None:
        view = self.view
        if self.connection_acknowledged and isinstance(view, GraphQLOverHTTP):
            payload = message["payload"]
            try:
                query = view.documents.resolve(payload.get("query"), payload.get("extensions"))
            except PersistedDocumentError as refused:
                error = GraphQLError(refused.message, extensions={"code": refused.code})
                await self.send_message(
                    {"id": message["id"], "type": "error", "payload": [error.formatted]}
                )
                return
            message = {**message, "payload": {**payload, "query": query or ""}}
        await super().handle_subscribe(message)

    async def handle_message(self, message: Message) -> None:
        await super().handle_message(message)
        # handle() keeps the message it read last in its frame until the next
        # one comes, for an idle subscription its subscribe message. What is
        # kept of that (its id, query and variables) has been taken by now.
        cast(dict[str, Any], message).clear()

    async def handle_connection_init(self, message: ConnectionInitMessage) -> None:
        await super().handle_connection_init(message)
        # Strawberry has cancelled the timeout's task; kept, it would hold its
        # CancelledError, traceback and frames for the connection's life. The
        # loop holds it until its cancellation has run.
        self.connection_init_timeout_task = None

    def run_operation(self, operation: Operation[Context, None]) -> Coroutine[Any, Any, None]:
        # A plain function handing Strawberry's coroutine to the operation's
        # task: a subscription waits inside it for as long as it lives, and a
        # wrapper coroutine around it would be one more frame per subscription.
        shares = getattr(self.view, "shares", None)
        tenant = self.context.tenant
        if (
            shares is None
            or not tenant
            or operation_type(operation.query, operation.operation_name)
            not in (CoreOperation.QUERY, CoreOperation.MUTATION)
        ):
            return super().run_operation(operation)
        return self._run_counted(operation, shares, tenant)

    async def _run_counted(
        self, operation: Operation[Context, None], shares: Shares, tenant: str
    ) -> None:
        # A query or mutation holds one of its tenant's slots while it runs,
        # as an HTTP request does (keyturn.http.fairness), and its checkouts
        # count against the tenant's connections; a subscription waiting for
        # events holds neither.
        if not await shares.enter(tenant):
            busy = GraphQLError(BUSY_ERROR["message"], extensions=BUSY_ERROR["extensions"])
            await operation.send_operation_message(
                ErrorMessage(id=operation.id, type="error", payload=[busy.formatted])
            )
            return
        try:
            with counted(shares.connections, tenant):
                await super().run_operation(operation)
        finally:
            shares.leave(tenant)


class GraphQLOverHTTP(GraphQL[Context, None]):
    websocket_adapter_class = _WebSocketAdapter
    graphql_transport_ws_handler_class = _TransportWS

    documents: PersistedDocuments
    shares: Shares | None = None  # per-tenant slots, shared with keyturn.http.fairness
    # Queries and mutations run by KeyturnSchema.run_operation, without
    # Strawberry's extension runner; False takes Schema.execute, which must
    # answer the same bytes (tests/integration/test_http_path_differential.py).
    plain_execution = True

    # A POST of one JSON document is answered by post_directly, without
    # Strawberry's HTTP machinery around the operation; False sends every
    # request through Strawberry's view, which must answer the same bytes
    # (tests/integration/test_http_path_differential.py).
    direct_post = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self.direct_post and scope["method"] == "POST":
            body = await read_body(receive)
            if body is None:
                return  # the client left before its request was whole
            if await self.post_directly(scope, body, receive, send):
                return
            receive = replaying(body, receive)
        request = Request(scope=scope, receive=receive)
        try:
            response = await self.run(request)
        except (Refused, PersistedDocumentError, HTTPException) as error:
            response = self._refused(request, error)
        await response(scope, receive, send)

    async def post_directly(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> bool:
        """What Strawberry's view answers a POST of one JSON document,
        answered here, in one frame, without its request adapter,
        sub-response, body parsing (the content type by the email package's
        parser) and two Response objects: a replayed submitTurn takes 0.85
        of the CPU it takes through the view.
        False, having sent nothing, for any request that is not that plain
        case (a batch, a stream, a body that is not a JSON object, one
        without a document): the view answers those, refusals included."""
        content_type = accept = None
        for key, value in scope["headers"]:
            if key == b"content-type":
                content_type = value.decode("latin-1")
            elif key == b"accept":
                accept = value.decode("latin-1")
        if content_type is None or content_type.split(";")[0].strip().lower() != JSON:
            return False
        # Only an Accept naming one of the two can ask for a stream (parsing
        # it with the email package, as Strawberry does, was 3% of a replay).
        wanted = (accept or "").lower()
        if (
            "multipart/mixed" in wanted or "text/event-stream" in wanted
        ) and self._get_stream_transport_from_headers({"accept": accept or ""}) is not None:
            return False
        try:
            data = self.decode_json(body)
        except ValueError:
            return False
        if not isinstance(data, dict):
            return False
        query, variables = data.get("query"), data.get("variables")
        extensions, name = data.get("extensions"), data.get("operationName")
        if not (
            isinstance(query, str | None)
            and isinstance(variables, dict | None)
            and isinstance(extensions, dict | None)
            and isinstance(name, str | None)
        ):
            return False
        request = Request(scope=scope, receive=receive)
        try:
            document = self.documents.resolve(query, extensions)
            if document is None:
                return False  # no document: the view says so
            # No resolver writes to the sub-response Strawberry would give.
            context = await self.get_context(request, cast(Any, None))
            result = await self._execute(document, variables, name, extensions, context, get=False)
        except (Refused, PersistedDocumentError, HTTPException) as error:
            await self._refused(request, error)(scope, receive, send)
            return True
        response = await self.process_result(request, result)
        if result.errors:
            self._handle_errors(result.errors, response)
        media = response_media_type(accept)
        payload = self.encode_json_bytes(response)
        await send(
            {
                "type": "http.response.start",
                "status": 400 if _is_refusal(media, response) else 200,
                "headers": [
                    (b"content-length", str(len(payload)).encode()),
                    (b"content-type", media.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        return True

    def encode_json_bytes(self, data: object) -> bytes:
        """An answer's body: :meth:`encode_json`, as bytes."""
        out = self.encode_json(data)
        return out.encode() if isinstance(out, str) else out

    def _refused(
        self, request: Request, error: Refused | PersistedDocumentError | HTTPException
    ) -> Response:
        if isinstance(error, PersistedDocumentError):
            return self._refusal(request, Refused(error.status, error.code, error.message))
        if isinstance(error, HTTPException):
            headers = {"Allow": "GET, POST"} if error.status_code == 405 else None
            code = _CODES.get(error.status_code, "BAD_REQUEST")
            return self._refusal(request, Refused(error.status_code, code, error.reason, headers))
        return self._refusal(request, error)

    def _refusal(self, request: Request, refused: Refused) -> Response:
        return Response(
            self.encode_json(error_body(refused.code, refused.message)),
            status_code=refused.status,
            media_type=response_media_type(request.headers.get("accept")),
            headers=refused.headers,
        )

    async def create_websocket_response(
        self, request: WebSocket, subprotocol: str | None
    ) -> WebSocket:
        # The connection's request id (keyturn.http.requestlog) in the
        # handshake's answer, as in every HTTP answer.
        rid = REQUEST_ID.get()
        await request.accept(
            subprotocol=subprotocol, headers=[(b"x-request-id", rid.encode())] if rid else None
        )
        return request

    def should_render_graphql_ide(self, request: Any) -> bool:
        # Only a GET is ever the page: a POST need not parse its query string
        # and headers to learn that (a few percent of a page read's time).
        if request.method != "GET":
            return False
        return is_ide_request(
            request.method, request.query_params, request.headers.get("accept", "")
        )

    async def get_sub_response(self, request: Request | Any) -> Response:
        sub_response = await super().get_sub_response(request)
        # Which media type this request's answer takes, for create_response.
        sub_response.media_type = response_media_type(request.headers.get("accept"))
        if request.method == "GET":
            # An answer depends on who asks (tenants) and how: a shared cache
            # must keep one per token and media type.
            sub_response.headers["vary"] = "Accept, Authorization"
        return sub_response

    def parse_json(self, data: str | bytes) -> Any:
        # A body that is JSON but not an object ("str", 123, null) is the
        # client's mistake, answered as one rather than failing inside.
        value = super().parse_json(data)
        if not isinstance(value, dict | list):
            raise Refused(
                400,
                "BAD_REQUEST",
                'the request body must be a JSON object: {"query": "…", "variables": {…}}',
            )
        return value

    async def parse_http_body(
        self, request: AsyncHTTPRequestAdapter
    ) -> GraphQLRequestData | list[GraphQLRequestData]:
        data = await super().parse_http_body(request)
        if isinstance(data, GraphQLRequestData):
            data.query = self.documents.resolve(data.query, data.extensions)
        return data

    async def execute_single(
        self,
        request: Request,
        request_adapter: AsyncHTTPRequestAdapter,
        sub_response: Response,
        context: Context,
        root_value: None,
        request_data: GraphQLRequestData,
    ) -> ExecutionResult:
        return await self._execute(
            request_data.query,
            request_data.variables,
            request_data.operation_name,
            request_data.extensions,
            context,
            get=request_adapter.method == "GET",
        )

    async def _execute(
        self,
        query: str | None,
        variables: dict[str, Any] | None,
        operation_name: str | None,
        extensions: dict[str, Any] | None,
        context: Context,
        *,
        get: bool,
    ) -> ExecutionResult:
        # A plain JSON answer carries one result: no subscriptions here (they
        # stream, above), and over GET nothing but queries.
        allowed = {OperationType.QUERY} if get else {OperationType.QUERY, OperationType.MUTATION}
        schema = self.schema
        run = (
            schema.run_operation
            if self.plain_execution and isinstance(schema, KeyturnSchema)
            else schema.execute
        )
        try:
            return await run(
                query,
                root_value=None,
                variable_values=variables,
                context_value=context,
                operation_name=operation_name,
                allowed_operation_types=allowed,
                operation_extensions=extensions,
            )
        except InvalidOperationTypeError as error:
            if error.operation_type == OperationType.SUBSCRIPTION:
                raise Refused(400, "BAD_REQUEST", HOW_TO_SUBSCRIBE) from None
            raise Refused(
                405,
                "METHOD_NOT_ALLOWED",
                "mutations are not allowed over GET: POST them as application/json",
                {"Allow": "POST"},
            ) from None
        except CannotGetOperationTypeError as error:
            raise Refused(400, "BAD_REQUEST", error.as_http_error_reason()) from None
        except MissingQueryError:
            raise Refused(400, "BAD_REQUEST", "no GraphQL document in the request") from None

    async def process_result(
        self, request: Request, result: ExecutionResult
    ) -> GraphQLHTTPResponse:
        response = await super().process_result(request, result)
        if _is_request_error(result) and (
            response_media_type(request.headers.get("accept")) == GRAPHQL_RESPONSE
        ):
            # The draft: a request error has no data entry (and a 4xx status).
            response.pop("data", None)
        return response

    def create_response(
        self,
        response_data: GraphQLHTTPResponse | list[GraphQLHTTPResponse],
        sub_response: Response,
    ) -> Response:
        response = super().create_response(response_data, sub_response)
        media = sub_response.media_type or "application/json"
        response.headers["content-type"] = media
        if _is_refusal(media, response_data) and not sub_response.status_code:
            response.status_code = 400
        return response

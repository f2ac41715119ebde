"""The ASGI application: /graphql (HTTP, WebSocket, GraphiQL), /healthz, the playground at /."""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from types import FrameType
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.exceptions import ConnectionRejectionError
from strawberry.subscriptions import (
    GRAPHQL_TRANSPORT_WS_PROTOCOL,
    MULTIPART_SUBSCRIPTION_PROTOCOL,
)
from strawberry.types.unset import UnsetType

from keyturn.db import embedded
from keyturn.db.engine import REQUEST_SETTINGS, create_engine
from keyturn.db.reads import RawJSON
from keyturn.errors import DatabaseBusy, DatabaseUnavailable
from keyturn.http import health, metrics
from keyturn.http.fairness import Fairness, Shares
from keyturn.http.graphiql import graphiql_mount, page_response
from keyturn.http.guard import AuthorizationProblem, Guard, bearer_token, websocket_closed
from keyturn.http.persisted import PersistedDocuments
from keyturn.http.playground import playground_mount
from keyturn.http.protocol import TRY_AGAIN_LATER, WS_REFUSAL, GraphQLOverHTTP
from keyturn.http.requestlog import RequestLog, request_id
from keyturn.logs import REQUEST_ID
from keyturn.resolvers.context import Context, QueryLimits
from keyturn.runtime.auth import Authenticator
from keyturn.runtime.process import Runtime
from keyturn.schema import MAX_DEPTH, build_schema, schema
from keyturn.settings import Settings

log = logging.getLogger(__name__)


def _raw_json(value: object) -> orjson.Fragment:
    """Event data read as its JSON text goes into the answer as it is."""
    if isinstance(value, RawJSON):
        return orjson.Fragment(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON")


class KeyturnGraphQL(GraphQLOverHTTP):
    def __init__(
        self,
        state: dict[str, Any],
        documents: PersistedDocuments,
        shares: Shares,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._state = state
        self.documents = documents
        self.shares = shares

    # orjson: several times faster than the standard library on every answer.
    # A str, not bytes: the WebSocket handler sends bytes as binary frames,
    # which graphql-transport-ws clients refuse.
    def encode_json(self, data: object) -> str:
        return orjson.dumps(data, default=_raw_json).decode()

    def encode_json_bytes(self, data: object) -> bytes:
        return orjson.dumps(data, default=_raw_json)

    def decode_json(self, data: str | bytes) -> object:
        return orjson.loads(data)

    async def render_graphql_ide(self, request: Request) -> Response:
        """GraphiQL from the package's own files (keyturn.http.graphiql), so it
        works with no network; Strawberry's page, which loads its scripts from a
        CDN, only if those files are missing."""
        return page_response() or await super().render_graphql_ide(request)

    async def get_context(self, request: Any, response: Any = None) -> Context:
        # HTTP requests were authenticated by the Guard, which left the tenant
        # in the scope; WebSockets authenticate in on_ws_connect.
        tenant = request.scope.get("state", {}).get("tenant", "")
        runtime = self._state["runtime"]
        return Context(
            runtime=runtime,
            request=request,
            response=response,
            tenant=tenant,
            limits=QueryLimits.of(runtime.settings),
        )

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """The token comes in the connection_init payload, ``Bearer TOKEN`` as on
        HTTP; a missing or wrong one closes the connection with 4403 (its reason
        says what was wrong) before any operation runs. A token that cannot be
        checked, the database being busy or not answering, closes it with 1013
        Try Again Later, as HTTP answers 503: the token may be fine."""
        auth: Authenticator = self._state["auth"]
        refusal = context.request.scope.setdefault("state", {})
        params = context.connection_params or {}
        raw = params.get("authorization") or params.get("Authorization") or params.get("token")
        try:
            if not await auth.required():
                return UnsetType()
            token = bearer_token(raw) if isinstance(raw, str) else None
            tenant = await auth.tenant_for(token)
        except AuthorizationProblem as problem:
            refusal[WS_REFUSAL] = (4403, str(problem))
            raise ConnectionRejectionError() from None
        except DatabaseUnavailable as error:
            why = "busy" if isinstance(error, DatabaseBusy) else "not answering"
            log.warning("WebSocket token check: the database is %s", why)
            refusal[WS_REFUSAL] = (
                TRY_AGAIN_LATER,
                f"service unavailable: the database is {why}; retry",
            )
            raise ConnectionRejectionError() from None
        if token is None or tenant is None:
            raise ConnectionRejectionError()
        context.tenant = tenant
        websocket = context.request
        auth.watch(
            id(websocket.scope), token, lambda: websocket.close(code=4403, reason="token revoked")
        )
        return UnsetType()


def _drain_on_sigterm(runtime: Runtime) -> Callable[[], None]:
    """Chain onto uvicorn's SIGTERM/SIGINT handler so that draining starts the
    moment the signal arrives, not only once uvicorn has closed every
    connection and reached lifespan shutdown."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: FrameType | None) -> None:
        runtime.drain()
        prev = previous[signal.Signals(signum)]
        if callable(prev):
            prev(signum, frame)

    for sig, prev in previous.items():
        if isinstance(getattr(prev, "__self__", None), uvicorn.Server):
            signal.signal(sig, handler)

    def restore() -> None:
        for sig, prev in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, prev)

    return restore


def create_app(settings: Settings | None = None, *, database_url: str | None = None) -> Starlette:
    settings = settings or Settings()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        url = database_url or embedded.resolve_url(settings.database_url, settings.data_dir)[0]
        engine = create_engine(
            url,
            pool_size=settings.pool_size,
            pool_timeout=settings.pool_timeout_s,
            server_settings=REQUEST_SETTINGS,
        )
        runtime = Runtime(
            engine=engine, settings=settings, database_url=url, stats=metrics.PrometheusStats()
        )
        auth = Authenticator(engine, recheck_s=settings.auth_recheck_s)
        runtime.supervise("auth-watch", auth.watch_forever)
        runtime.supervise("metrics-sampler", lambda: metrics.sample_forever(runtime))
        await runtime.start()
        state["runtime"], state["auth"] = runtime, auth
        _app.state.runtime = runtime
        restore = _drain_on_sigterm(runtime)
        # What is alive once started (the schema, modules, the pool) stays for
        # the process's life: out of the collector's way, a full collection
        # walks only what requests leave, not 100 ms of startup objects each
        # time (a tenth of a page request's time, measured). Given back on the
        # way out, so a process that runs several servers in turn frees them.
        gc.collect()
        gc.freeze()
        # The youngest generation collected every 10,000 new objects rather
        # than every 700: a page of 100 events makes thousands, each answered
        # and let go before it ends, and a collection every few hundred of
        # them walked them for nothing (0.85-0.90 of a page's CPU and
        # 0.89-0.99 of a replay's with it, switched in turn in one process).
        thresholds = gc.get_threshold()
        gc.set_threshold(10_000, *thresholds[1:])
        try:
            yield
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            restore()
            await runtime.stop()
            metrics.process_stopped(runtime)
            await engine.dispose()

    # Read at start: a registered_only server with a bad file refuses to start.
    documents = PersistedDocuments.from_file(
        settings.persisted_documents, settings.persisted_documents_file
    )
    # One tenant's slots, whether its operations come over HTTP or a WebSocket.
    shares = Shares(limit=settings.tenant_concurrency, wait_s=settings.pool_timeout_s)
    graphql_app = KeyturnGraphQL(
        state,
        documents,
        shares,
        schema=schema
        if settings.introspection and settings.max_query_depth == MAX_DEPTH
        else build_schema(introspection=settings.introspection, max_depth=settings.max_query_depth),
        graphql_ide="graphiql" if settings.graphiql else None,
        subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL, MULTIPART_SUBSCRIPTION_PROTOCOL),
        connection_init_wait_timeout=timedelta(seconds=settings.connection_init_timeout_s),
        max_subscriptions_per_connection=settings.max_subscriptions_per_connection,
        allowed_origins=[o.strip() for o in settings.allowed_origins.split(",") if o.strip()],
        allow_queries_via_get=True,
    )

    middleware = [
        Middleware(RequestLog),
        Middleware(
            Guard,
            state=state,
            max_body_bytes=settings.max_body_bytes,
            metrics_public=settings.metrics_public,
        ),
        # Inside the Guard, which names the request's tenant.
        Middleware(Fairness, shares=shares),
    ]
    # The same middlewares around the view alone: what an HTTP request to
    # /graphql passes through (Starlette builds its stack from the list too).
    graphql_http: ASGIApp = graphql_app
    for layer in reversed(middleware):
        graphql_http = layer.cls(graphql_http, *layer.args, **layer.kwargs)
    return _Keyturn(
        graphql_websocket=graphql_app,
        graphql_http=graphql_http,
        state=state,
        routes=[
            Route("/graphql", graphql_app),
            WebSocketRoute("/graphql", graphql_app),
            Route("/healthz", health.healthz),
            Route("/readyz", health.readyz),
            Route("/metrics", metrics.endpoint),
            graphiql_mount(settings.graphiql),
            playground_mount(),  # last: it answers every other path
        ],
        middleware=middleware,
        lifespan=lifespan,
    )


class _Keyturn(Starlette):
    """Starlette, with a request to /graphql handed straight to its view.

    An HTTP request goes through the application's three middlewares and
    the view, and not through Starlette's error and exception middlewares
    and its router as well: they hold no handler of their own for it (the
    view answers every error itself, and uvicorn answers 500 for one that
    escapes, as Starlette would): a few percent of a replay's CPU.

    A WebSocket stays inside the application for as long as it is open, and
    each layer it passes through on the way in stays with it: Starlette's
    error and exception middlewares, its router and route (six frames), then
    RequestLog, the Guard and the view's ASGI entry (five more), per
    connection, for a WebSocket whose view answers every error itself. What
    the two middlewares do for one is done here, in this one frame: the
    request id of RequestLog (the view puts it in the handshake's answer)
    and the Guard's clean-up once it ends. Fairness lets WebSockets by
    (their operations are counted one by one, keyturn.http.protocol)."""

    def __init__(
        self,
        *,
        graphql_websocket: KeyturnGraphQL,
        graphql_http: ASGIApp,
        state: dict[str, Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._graphql_websocket = graphql_websocket
        self._graphql_http = graphql_http
        self._state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/graphql":
            scope["app"] = self
            await self._graphql_http(scope, receive, send)
            return
        if scope["type"] != "websocket" or scope["path"] != "/graphql":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        token = REQUEST_ID.set(request_id(scope))
        try:
            # What the view's ASGI entry does with a WebSocket.
            await self._graphql_websocket.run(WebSocket(scope, receive=receive, send=send))
        finally:
            websocket_closed(self._state, scope)
            REQUEST_ID.reset(token)

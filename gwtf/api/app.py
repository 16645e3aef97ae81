"""``create_app``: the node's local REST API, its metrics and its dashboard, over ``NodeServices``.

Bound to 127.0.0.1 by whoever serves it (``gwtf.node.local_api.server``). Every route reads; the one
that acts (``POST /v1/claim``) needs the bearer token kept in the node's home. CORS is
off unless origins are given. Routes are plain ``def``: Starlette runs them in worker threads, so
a database read never blocks the server's loop.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.middleware.trustedhost import TrustedHostMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles

from gwtf.api.docs import mount_docs
from gwtf.api.metrics import CONTENT_TYPE, exposition
from gwtf.api.schemas import (
    ClaimRequest,
    ClaimResult,
    Earnings,
    FlowView,
    Health,
    History,
    NodeView,
    PeerView,
    Problem,
    ReceiptPage,
    RunView,
    Slashed,
    Status,
)
from gwtf.api.services import NodeServices, NotReady, Refused

#: The dashboard's and the docs' built assets (``make install`` builds them:
#: ``gwtf/api/dashboard``).
DASHBOARD = Path(__file__).resolve().parent / "static"
MAX_PAGE = 500
#: Health states in which the node is up and takes part: ``/healthz`` answers them with 200.
SERVING = frozenset({"ok", "idle"})
NOT_READY: dict[int | str, dict[str, Any]] = {
    503: {"model": Problem, "description": "the node cannot answer yet"}
}


def create_app(
    services: NodeServices,
    *,
    token: str,
    cors_origins: tuple[str, ...] = (),
    dashboard_dir: Path = DASHBOARD,
    allowed_hosts: tuple[str, ...] = ("*",),
) -> FastAPI:
    """The API of one node. ``token`` guards the mutating routes (compared in constant time);
    ``allowed_hosts`` are the Host headers answered (a page whose own name was made to point at
    127.0.0.1, DNS rebinding, sends its own name and is refused)."""
    if len(token) < 16:
        raise ValueError("the API token must be at least 16 characters")
    app = FastAPI(
        title="GWTF node",
        version="1",
        description="A GWTF node's status, earnings, receipts, peers and flows (local only).",
        # Served from the package's own assets (``gwtf.api.docs``): FastAPI's pages load a CDN.
        docs_url=None,
        redoc_url=None,
    )
    if allowed_hosts != ("*",):
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET"])

    @app.exception_handler(NotReady)
    def not_ready(_request: Request, exc: NotReady) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(Refused)
    def refused(_request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    app.state.token = token

    @app.exception_handler(_Unauthorised)
    def unauthorised(_request: Request, _exc: _Unauthorised) -> JSONResponse:
        return JSONResponse(
            {"detail": "a bearer token is needed: the one in the node's home"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.get(
        "/healthz",
        response_model=Health,
        responses={
            200: {"description": "ok (it trains) or idle (up, but nothing trains through it)"},
            503: {"model": Health, "description": "starting, degraded or stopping"},
        },
        tags=["node"],
    )
    def healthz(response: Response) -> Health:
        # A probe (a supervisor, a load balancer) reads the code. An idle node is up and
        # reachable, waiting for work: restarting it would help nothing, so it answers 200.
        health = services.health()
        if health.status not in SERVING:
            response.status_code = 503
        return health

    @app.get("/v1/status", response_model=Status, responses=NOT_READY, tags=["node"])
    def status() -> Status:
        return services.status()

    @app.get("/v1/peers", response_model=list[PeerView], responses=NOT_READY, tags=["node"])
    def peers() -> list[PeerView]:
        return services.peers()

    @app.get("/v1/flows", response_model=list[FlowView], responses=NOT_READY, tags=["node"])
    def flows() -> list[FlowView]:
        return services.flows()

    @app.get("/v1/history", response_model=History, responses=NOT_READY, tags=["node"])
    def history() -> History:
        return services.history()

    @app.get("/v1/earnings", response_model=Earnings, responses=NOT_READY, tags=["earnings"])
    def earnings() -> Earnings:
        return services.earnings()

    @app.get("/v1/receipts", response_model=ReceiptPage, responses=NOT_READY, tags=["earnings"])
    def receipts(
        offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        epoch: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
    ) -> ReceiptPage:
        return services.receipts(offset, limit, epoch)

    @app.get("/v1/node", response_model=NodeView, responses=NOT_READY, tags=["node"])
    def node() -> NodeView:
        return services.node()

    @app.get("/v1/runs", response_model=list[RunView], responses=NOT_READY, tags=["earnings"])
    def runs() -> list[RunView]:
        return services.runs()

    @app.get("/v1/slashes", response_model=list[Slashed], responses=NOT_READY, tags=["earnings"])
    def slashes() -> list[Slashed]:
        return services.slashes()

    @app.post(
        "/v1/claim",
        response_model=ClaimResult,
        dependencies=[Depends(_authorised)],
        responses={
            400: {"model": Problem, "description": "the body is not JSON"},
            401: {"model": Problem, "description": "no or wrong bearer token"},
            409: {"model": Problem, "description": "nothing can be claimed that way now"},
            **NOT_READY,
        },
        tags=["earnings"],
    )
    def claim(request: ClaimRequest) -> ClaimResult:
        return services.claim(request.epoch)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text"}},
        tags=["node"],
    )
    def metrics() -> Response:
        return Response(exposition(services.metrics), media_type=CONTENT_TYPE)

    mount_docs(app, dashboard_dir)
    _mount_dashboard(app, dashboard_dir)
    return app


class _Unauthorised(Exception):
    pass


_BEARER = HTTPBearer(auto_error=False)


def _authorised(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
) -> None:
    """The mutating routes' guard: the app's token, compared in constant time."""
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), request.app.state.token.encode()):
        raise _Unauthorised()


def _mount_dashboard(app: FastAPI, folder: Path) -> None:
    index = folder / "index.html"

    @app.get("/", include_in_schema=False, response_model=None)
    def dashboard() -> Any:
        if not index.is_file():
            return JSONResponse(
                {"detail": "the dashboard is not built; run `make install` (npm ci builds it)"},
                status_code=404,
            )
        return FileResponse(index)

    if folder.is_dir():
        app.mount("/assets", StaticFiles(directory=folder), name="assets")

"""The FastAPI application: REST API under ``/api``, pages, static assets, ``/metrics``.

Build it with :func:`create_app`; ``robofleet dashboard`` (``robofleet.commands.dashboard``) serves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dashboard import accounts, bodies
from dashboard.accounts import Principal
from dashboard.api import audit, auth, fleet, help_requests, policies, runs, station
from dashboard.api import episodes as episode_api
from dashboard.api.common import AUTH_ERRORS
from dashboard.config import AppSettings
from dashboard.deps import SESSION_COOKIE, require_viewer
from dashboard.login_throttle import LoginThrottle
from dashboard.prometheus import make_registry
from foundation import __version__
from foundation.contracts import EpisodeSource, RobotControl, RunManager
from foundation.store.accounts import Role, TokenKind
from foundation.store.metadata_store import MetadataStore

HERE = Path(__file__).parent
# Everything is served from here; the policy forbids any other origin (no CDN, no inline code).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

# page path -> (template, title, minimum role)
PAGES: dict[str, tuple[str, str, Role]] = {
    "/": ("fleet.html", "Fleet", Role.VIEWER),
    "/enroll": ("enroll.html", "Enroll a robot", Role.OPERATOR),
    "/station": ("station.html", "Operator station", Role.OPERATOR),
    "/runs": ("runs.html", "Runs", Role.VIEWER),
    "/policies": ("policies.html", "Checkpoints and policy versions", Role.VIEWER),
    "/audit": ("audit.html", "Audit log", Role.VIEWER),
    "/account": ("account.html", "Account and API tokens", Role.VIEWER),
    "/users": ("users.html", "Users", Role.ADMIN),
}


def create_app(
    settings: AppSettings,
    store: MetadataStore,
    run_manager: RunManager,
    robot_control: RobotControl | None = None,
    episodes: EpisodeSource | None = None,
) -> FastAPI:
    """The dashboard app over ``store``.

    Args:
        settings: effective settings (``dashboard`` section, ``data_dir``, secret key).
        store: the metadata store, migrated to head (``robofleet db upgrade``).
        run_manager: launches and controls runs (the cloud's own, or one that records
            requests for a cloud in another process to act on).
        robot_control: comms' ``CloudServer`` when the dashboard runs in the cloud process:
            an e-stop or clear is pushed to the robot at once, and the operator station
            (``dashboard.api.station``) reaches robots through it. Without it (or when the robot
            is not connected) the cloud's e-stop sync (``runs.estop``)
            delivers it from the store within a second.
        episodes: runs' stored episodes for the run page's episode viewer
            (``runs.episode_view.RunEpisodes``); without it those routes answer 503.
    """
    app = FastAPI(
        title="robofleet dashboard",
        version=__version__,
        description=(
            "Enroll robots, launch and watch HG-DAgger, RECAP and SAC runs, promote policy"
            " versions. Authenticate with the session cookie from `POST /api/auth/login`"
            " (unsafe requests then need the `X-CSRF-Token` header) or with"
            " `Authorization: Bearer <API token>`. Robot credentials are refused."
        ),
        # Served by the viewer-guarded route below: FastAPI's own route has no authentication.
        openapi_url=None,
        docs_url=None,  # the Swagger UI would pull scripts from a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.robot_control = robot_control
    app.state.episodes = episodes
    app.state.secret = settings.secret()
    app.state.run_manager = run_manager
    d = settings.dashboard
    app.state.login_throttle = LoginThrottle(
        d.login_max_failures, d.login_max_failures_per_client, d.login_window_s
    )
    registry = make_registry(store)

    for module in (auth, fleet, runs, episode_api, help_requests, policies, audit, station):
        app.include_router(module.router, prefix="/api")
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document plus the run spec's schemas (the launch route's body)."""
        schema = generate()
        schema.setdefault("components", {}).setdefault("schemas", {}).update(
            runs.run_spec_schemas()
        )
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get(
        "/api/openapi.json",
        tags=["meta"],
        summary="This OpenAPI document (viewer role)",
        responses=AUTH_ERRORS,
    )
    def openapi_document(_: Annotated[Principal, Depends(require_viewer)]) -> dict[str, Any]:
        return app.openapi()

    bodies.install(app)  # before security_headers, which then wraps its 422s too

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if request.url.path.startswith("/api/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.get("/healthz", tags=["meta"], summary="Liveness (no authentication)")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/metrics",
        tags=["meta"],
        summary="Prometheus metrics: fleet, buffer and learner figures",
        responses={**AUTH_ERRORS, 200: {"content": {CONTENT_TYPE_LATEST: {}}}},
        response_class=Response,
    )
    def metrics(_: Annotated[Principal, Depends(require_viewer)]) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    _add_pages(app)
    return app


def _add_pages(app: FastAPI) -> None:
    from dashboard.exposure import plaintext_servers

    templates = Jinja2Templates(directory=HERE / "templates")
    settings = app.state.settings
    # Accepted with insecure_network: every page says which servers speak in the clear.
    templates.env.globals["plaintext_servers"] = (
        plaintext_servers(settings.comms, settings.dashboard) if settings.insecure_network else []
    )

    def session_principal(request: Request) -> Principal | None:
        token = request.cookies.get(SESSION_COOKIE)
        if not token:
            return None
        return accounts.resolve(request.app.state.store, token, TokenKind.SESSION)

    def render(request: Request, template: str, title: str, role: Role, **ctx: Any) -> Response:
        principal = session_principal(request)
        if principal is None:
            return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
        if principal.role.rank < role.rank:
            raise HTTPException(403, f"this page needs the {role.value} role")
        return templates.TemplateResponse(
            request,
            template,
            {"title": title, "user": principal, "page": template.removesuffix(".html"), **ctx},
        )

    def page_route(path: str, template: str, title: str, role: Role) -> None:
        def handler(request: Request) -> Response:
            return render(request, template, title, role)

        handler.__name__ = f"page_{template.removesuffix('.html')}"
        app.get(path, include_in_schema=False, response_class=HTMLResponse)(handler)

    for path, (template, title, role) in PAGES.items():
        page_route(path, template, title, role)

    @app.get("/runs/{run_id}", include_in_schema=False, response_class=HTMLResponse)
    def page_run(run_id: str, request: Request) -> Response:
        if (
            session_principal(request) is not None
            and request.app.state.store.get_run(run_id) is None
        ):
            raise HTTPException(404, f"no run with id {run_id!r}")
        return render(request, "run.html", f"Run {run_id}", Role.VIEWER, run_id=run_id)

    @app.get("/login", include_in_schema=False, response_class=HTMLResponse)
    def page_login(request: Request) -> Response:
        return templates.TemplateResponse(
            request, "login.html", {"title": "Log in", "user": None, "page": "login"}
        )

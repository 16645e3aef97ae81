"""``/docs``: Swagger UI over the API's OpenAPI schema, served from the package's own assets.

FastAPI's default page loads Swagger UI from a CDN, so a node without Internet access showed a
blank page. Here the page is FastAPI's own (``get_swagger_ui_html``) pointed at the copy of
``swagger-ui-dist`` that ``dashboard/build.mjs`` puts in ``static/swagger-ui`` (pinned by
package-lock.json, like the dashboard's chart library). ReDoc is off: it would be a second
bundle, and its page fetches web fonts.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response

#: Where the assets are served from: the dashboard's static mount (``/assets``).
ASSETS_URL = "/assets/swagger-ui"
BUNDLE = "swagger-ui-bundle.js"


def mount_docs(app: FastAPI, static_dir: Path) -> None:
    """Serve ``/docs``, or a 404 that says how to build the assets when they are missing."""
    bundle = static_dir / "swagger-ui" / BUNDLE

    @app.get("/docs", include_in_schema=False, response_model=None)
    def docs() -> Response:
        if not bundle.is_file():
            why = "the docs' assets are not built; run `make install` (npm ci builds them)"
            return JSONResponse({"detail": why}, status_code=404)
        return swagger_page(app.openapi_url or "/openapi.json", app.title)


def swagger_page(openapi_url: str, title: str) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=openapi_url,
        title=f"{title} — API docs",
        swagger_js_url=f"{ASSETS_URL}/{BUNDLE}",
        swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_URL}/favicon-32x32.png",
        # Swagger UI would otherwise ask validator.swagger.io to check the schema and show
        # its badge: an outside request, and the schema is FastAPI's own.
        swagger_ui_parameters={"validatorUrl": None},
    )

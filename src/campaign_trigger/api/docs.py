"""The OpenAPI pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), with every asset
served by the service itself from ``api/static`` (see its README): no CDN, no web
fonts, no validator badge, so the pages work on a self-hosted box with no internet.

Their Content-Security-Policy lets them load nothing from another origin: ReDoc's
sidebar shows a logo from its vendor's CDN, which the browser then never asks for (the
image hides itself when it fails).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR: Final = Path(__file__).with_name("static")
STATIC_PREFIX: Final = "/static"
SWAGGER_JS: Final = f"{STATIC_PREFIX}/swagger-ui/swagger-ui-bundle.js"
SWAGGER_CSS: Final = f"{STATIC_PREFIX}/swagger-ui/swagger-ui.css"
FAVICON: Final = f"{STATIC_PREFIX}/swagger-ui/favicon-32x32.png"
REDOC_JS: Final = f"{STATIC_PREFIX}/redoc/redoc.standalone.js"
# the pages' own inline script and style (FastAPI's templates) are allowed; ReDoc runs
# its search in a worker made from a blob
PAGE_POLICY: Final = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


def _confined(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = PAGE_POLICY
    return page


def install_docs(app: FastAPI) -> None:
    """Serve the assets and both pages (create the app with ``docs_url=None``,
    ``redoc_url=None``)."""
    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR), name="static")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def read_swagger_ui() -> HTMLResponse:
        return _confined(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{app.title} - Swagger UI",
                swagger_js_url=SWAGGER_JS,
                swagger_css_url=SWAGGER_CSS,
                swagger_favicon_url=FAVICON,
                swagger_ui_parameters={"validatorUrl": None},
            )
        )

    @app.get("/redoc", include_in_schema=False)
    async def read_redoc() -> HTMLResponse:
        return _confined(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{app.title} - ReDoc",
                redoc_js_url=REDOC_JS,
                redoc_favicon_url=FAVICON,
                with_google_fonts=False,
            )
        )

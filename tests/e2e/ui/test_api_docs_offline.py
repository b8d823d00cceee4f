"""The API's OpenAPI pages in Debian's chromium (Playwright) with every request off this
machine refused, as on a self-hosted box without internet: Swagger UI and ReDoc render
the API from assets the service serves itself, and ask nothing of any other host.
Screenshots go to a temporary folder; ``make screenshots`` (``CT_SCREENSHOTS_DIR=docs/img``)
writes the ones the docs show."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from integration.api.api_tenants import Server, start_api_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(
            "!!! NO CHROMIUM at /usr/bin/chromium: the offline /docs browser test is SKIPPED; "
            "install it with `apt-get install -y chromium` !!!"
        )
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def api(session_dir: Path) -> Iterator[Server]:
    server = start_api_server(session_dir)
    try:
        yield server
    finally:
        server.process.stop()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: a temporary folder, or ``CT_SCREENSHOTS_DIR`` (make screenshots)."""
    return Path(os.environ.get("CT_SCREENSHOTS_DIR") or tmp_path)


def _offline_page(chromium: Any, refused: list[str]) -> Any:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})

    def only_this_machine(route: Any) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", only_this_machine)
    return context.new_page()


def test_swagger_ui_renders_offline(chromium: Any, api: Server, shots: Path) -> None:
    refused: list[str] = []
    page = _offline_page(chromium, refused)
    page.goto(f"{api.url}/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
    assert "campaign-trigger" in page.inner_text(".swagger-ui .info .title")
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any("/api/campaigns/trigger" in p for p in paths), paths
    assert any("/api/inapp/messages" in p for p in paths), paths
    page.screenshot(path=str(shots / "api-docs-offline.png"))
    assert refused == []


def test_redoc_renders_offline(chromium: Any, api: Server, shots: Path) -> None:
    refused: list[str] = []
    page = _offline_page(chromium, refused)
    page.goto(f"{api.url}/redoc")
    page.wait_for_selector("h1", timeout=30_000)
    assert "campaign-trigger" in page.inner_text("h1")
    page.wait_for_function(
        "document.body.innerText.includes('/api/campaigns/trigger')", timeout=30_000
    )
    page.screenshot(path=str(shots / "api-redoc-offline.png"))
    assert refused == []

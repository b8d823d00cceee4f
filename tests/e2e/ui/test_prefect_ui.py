"""The Prefect UI of a running stack (``campaign-trigger up`` on free ports), in Debian's
chromium driven by Playwright: the send-batch deployment and its form, a finished
request's delivery run with its summary artifact, a refused batch's artifact.
Screenshots go to a temporary folder; ``make screenshots`` (``CT_SCREENSHOTS_DIR=docs/img``)
writes the ones ``docs/prefect-ui.md`` shows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import VENV_BIN, ManagedProcess, free_port, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEMO_MESSAGES = [
    {"user_id": f"user-{n}", "template_variables": {"first_name": name, "order_id": f"A-{n}"}}
    for n, name in [(1, "Ada"), (2, "Alan"), (7, "Grace"), (11, "Edsger"), (23, "Barbara")]
]


@dataclass
class UpStack:
    ui: str
    api: str
    prefect_api: str
    process: ManagedProcess

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """A Prefect API call, retried while a SQLite-backed server answers 503."""
        for _attempt in range(10):
            response = httpx.request(method, f"{self.prefect_api}{path}", timeout=30, **kwargs)
            if response.status_code != 503:
                break
            time.sleep(1)
        assert response.status_code < 300, response.text
        return response.json()

    def wait(self, what: str, check: Any, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"{what} not seen in {timeout}s\n{self.process.log_tail(60)}")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(
            "!!! NO CHROMIUM at /usr/bin/chromium: the Prefect UI browser test is SKIPPED; "
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
def stack(session_dir: Path, chromium: Any) -> Iterator[UpStack]:
    """``campaign-trigger up`` with its own home, Prefect server and ports."""
    api_port, sandbox_port, prefect_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "CT_"))}
    env.update(
        CT_HOME=str(session_dir / "ui-stack"),
        CT_SECRET_KEY=os.environ["CT_SECRET_KEY"],
        CT_API_PORT=str(api_port),
        CT_SANDBOX_PORT=str(sandbox_port),
        CT_PREFECT_PORT=str(prefect_port),
    )
    process = ManagedProcess(
        "up",
        [str(VENV_BIN / "campaign-trigger"), "up"],
        env=env,
        log_dir=session_dir,
        inherit_env=False,
    )
    try:
        prefect_api = f"http://127.0.0.1:{prefect_port}/api"
        wait_http(f"{prefect_api}/health", timeout=150, process=process)
        wait_http(f"http://127.0.0.1:{api_port}/health", timeout=150, process=process)
        yield UpStack(
            ui=f"http://127.0.0.1:{prefect_port}",
            api=f"http://127.0.0.1:{api_port}",
            prefect_api=prefect_api,
            process=process,
        )
    finally:
        process.stop()


def run_like_the_ui_form(stack: UpStack, deployment_id: str, batch: dict[str, Any]) -> str:
    body = {
        "parameters": {"batch": batch, "wait": False},
        "state": {"type": "SCHEDULED", "message": "Run from the Prefect UI"},
    }
    return str(stack.call("POST", f"/deployments/{deployment_id}/create_flow_run", json=body)["id"])


def final_run(stack: UpStack, flow_run_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run: dict[str, Any] = stack.call("GET", f"/flow_runs/{flow_run_id}")
        return run if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED") else None

    result: dict[str, Any] = stack.wait(f"flow run {flow_run_id} ending", done)
    return result


def test_the_ui_shows_send_batch_and_a_delivered_request_with_its_summary(
    stack: UpStack, chromium: Any, tmp_path: Path
) -> None:
    images = Path(os.environ.get("CT_SCREENSHOTS_DIR") or tmp_path)
    deployment = stack.wait(
        "the send-batch deployment",
        lambda: (
            httpx.get(f"{stack.prefect_api}/deployments/name/send-batch/send-batch", timeout=10)
            .json()
            .get("id")
        ),
    )
    sender = final_run(
        stack,
        run_like_the_ui_form(
            stack, deployment, {"campaign_id": "demo-campaign", "messages": DEMO_MESSAGES}
        ),
    )
    assert sender["state"]["type"] == "COMPLETED", (sender["state"], stack.process.log_tail(80))
    request_id = sender["name"].removeprefix("send ")
    assert "campaign:demo-campaign" in sender["tags"]

    def delivery_run() -> dict[str, Any] | None:
        runs = stack.call(
            "POST", "/flow_runs/filter", json={"flow_runs": {"name": {"any_": [request_id]}}}
        )
        return runs[0] if runs and runs[0]["state"]["type"] == "COMPLETED" else None

    delivery = stack.wait("the delivery run completed", delivery_run)
    artifacts = stack.call(
        "POST", "/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [delivery["id"]]}}}
    )
    summary = next(a for a in artifacts if a["description"] == "Delivery summary")
    assert summary["flow_run_id"] == delivery["id"]

    refused = final_run(
        stack,
        run_like_the_ui_form(
            stack, deployment, {"campaign_id": "no-such-campaign", "csv_path": "incoming/x.csv"}
        ),
    )
    assert refused["state"]["type"] == "FAILED"
    refusals = stack.call(
        "POST",
        "/artifacts/filter",
        json={"artifacts": {"flow_run_id": {"any_": [refused["id"]]}}},
    )
    refusal = next(a for a in refusals if a["key"] == "send-batch-refused")
    assert refusal["flow_run_id"] == refused["id"]

    page = chromium.new_page(viewport={"width": 1400, "height": 950})
    try:
        # The UI a browser lands in is the classic one the docs describe, not Prefect's
        # new UI under /v2 (campaign-trigger up sets PREFECT_SERVER_UI_V2_ENABLED=false).
        page.goto(f"{stack.ui}/", wait_until="networkidle")
        assert "/v2" not in page.url, page.url
        page.goto(f"{stack.ui}/deployments", wait_until="networkidle")
        page.get_by_text("daily-csv-batch").first.wait_for()
        assert page.get_by_text("send-batch", exact=True).count() >= 1
        assert "Can't connect to Server API" not in page.inner_text("body")

        page.goto(f"{stack.ui}/deployments/deployment/{deployment}/run", wait_until="networkidle")
        page.get_by_text("Campaign Id").first.wait_for()
        form = page.inner_text("body")
        for label in ("Send At", "Csv Path", "Messages", "The campaign's identifier"):
            assert label in form
        page.screenshot(path=str(images / "prefect-ui-send-batch-form.png"))

        page.goto(f"{stack.ui}/runs/flow-run/{delivery['id']}", wait_until="networkidle")
        page.get_by_text(request_id).first.wait_for()
        page.get_by_text("Artifacts", exact=True).first.click()
        page.get_by_text("Delivery summary").first.wait_for()
        assert "campaign:demo-campaign" in page.inner_text("body")
        page.screenshot(path=str(images / "prefect-ui-run.png"))

        page.goto(f"{stack.ui}/artifacts/artifact/{summary['id']}", wait_until="networkidle")
        page.get_by_text(f"Delivery of request {request_id}").first.wait_for()
        body = page.inner_text("body")
        assert "FPErrTokenUnregistered" in body or "sent" in body
        page.screenshot(path=str(images / "prefect-ui-summary.png"))

        page.goto(f"{stack.ui}/artifacts/artifact/{refusal['id']}", wait_until="networkidle")
        page.get_by_text("Validation problems").first.wait_for()
        assert "Unknown campaign with identifier no-such-campaign" in page.inner_text("body")
        page.screenshot(path=str(images / "prefect-ui-refused.png"))
    finally:
        page.close()

"""Operator views: ``campaign-trigger status`` and ``campaign-trigger requests show ID``.

Both read the database, the storage and the Prefect server the settings name (the
embedded stack's, as ``campaign-trigger up`` runs it, when PREFECT_API_URL is not set).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated

import typer

from campaign_trigger.cli.base import app, fail, migrate, say
from campaign_trigger.config import get_settings
from campaign_trigger.errors import CampaignTriggerError

requests_app = typer.Typer(help="Look at requests (any organisation).", no_args_is_help=True)
app.add_typer(requests_app, name="requests")


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else "-"


@contextmanager
def _stack_prefect() -> Iterator[None]:
    """The Prefect server PREFECT_API_URL names, else the one ``up`` runs (CT_PREFECT_PORT)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield
        return
    embedded = f"http://127.0.0.1:{get_settings().prefect_port}/api"
    with temporary_settings({PREFECT_API_URL: embedded}):
        yield


@app.command()
def status() -> None:
    """Each part's health, the outbox depth, the webhook events waiting, the workers
    online, the scheduled requests per campaign and the last failed requests; exits 1 when
    a part is down."""
    from campaign_trigger.deployments.catalog import DELIVERY_POOL
    from campaign_trigger.services.operations import stack_status

    with _stack_prefect():
        view = asyncio.run(stack_status(settings=get_settings(), pool=DELIVERY_POOL))
    report = view.health
    for part in ("database", "storage", "prefect"):
        error = report["errors"].get(part)
        say(f"{part:<12}{'ok' if error is None else 'DOWN: ' + error}")
    for name, provider in report["providers"].items():
        state = provider["status"] if provider["status"] == "ok" else provider["error"]
        say(f"{name:<12}{state}  ({provider['url']})")
    outbox = "unknown" if view.outbox_depth is None else f"{view.outbox_depth} waiting"
    say(f"{'outbox':<12}{outbox}")
    waiting = "unknown" if view.webhooks_waiting is None else f"{view.webhooks_waiting} waiting"
    say(f"{'webhooks':<12}{waiting} (completion events not yet accepted)")
    if view.workers is None:
        say(f"{'workers':<12}unknown (Prefect is down)")
    else:
        say(f"{'workers':<12}{len(view.workers)} online {' '.join(view.workers)}".rstrip())
    say("scheduled requests per campaign:" if view.scheduled else "scheduled requests: none")
    for campaign, count in view.scheduled:
        say(f"  {campaign}  {count}")
    say("last failed requests:" if view.failures else "failed requests: none")
    for request in view.failures:
        say(f"  {request.id}  campaign {request.campaign_id}  {_when(request.requested_at)}")
    if report["down"]:
        fail(", ".join(f"{part.capitalize()} is down" for part in report["down"]))


@requests_app.command("show")
def show_request(request_id: Annotated[str, typer.Argument(help="The request id.")]) -> None:
    """A request's state, messages per outcome, report links and Prefect run page."""
    from campaign_trigger.services.operations import request_detail
    from campaign_trigger.store.db import session_scope

    migrate()
    try:
        with _stack_prefect(), session_scope() as session:
            detail = asyncio.run(
                request_detail(session=session, settings=get_settings(), request_id=request_id)
            )
    except CampaignTriggerError as exc:
        fail(exc.message)
    request = detail.request
    say(f"request     {request.id}")
    say(f"campaign    {request.campaign_id}")
    say(f"state       {request.state.value}")
    say(f"send at     {_when(request.send_at)}")
    say(f"messages    {request.message_count}")
    for outcome, count in detail.outcomes.items():
        say(f"  {outcome}: {count}")
    say(f"prefect run {detail.run_url or '-'}")
    say("reports" if detail.reports else "reports     none yet")
    for link in detail.reports:
        say(f"  {link}")

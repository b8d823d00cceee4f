"""``campaign-trigger admin`` commands for completion webhooks: ``add-webhook``,
``list-webhooks``, ``remove-webhook``, ``webhook-attempts``.

See :mod:`campaign_trigger.services.webhooks` and ``docs/webhooks.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sqlmodel import Session

InSession = Callable[[Callable[["Session"], Any]], Any]
Org = Annotated[str, typer.Option("--org", help="Organisation name.")]


def _org_id(session: Session, name: str) -> int:
    from campaign_trigger.services.admin import get_org

    org = get_org(session=session, name=name)
    assert org.id is not None
    return org.id


def register(admin: typer.Typer, *, in_session: InSession, say: Callable[[str], None]) -> None:
    """Add the webhook commands to ``admin``."""

    @admin.command("add-webhook")
    def add_webhook(org: Org, url: Annotated[str, typer.Argument(help="An https:// URL.")]) -> None:
        """Register a URL for the organisation's completion events; prints its signing
        secret, this once."""
        from campaign_trigger.config import get_settings
        from campaign_trigger.services import webhooks

        def add(session: Session) -> tuple[str, str, str]:
            registered = webhooks.register(
                session=session, settings=get_settings(), org_id=_org_id(session, org), url=url
            )
            return registered.endpoint.id, registered.endpoint.url, registered.secret

        endpoint_id, endpoint_url, secret = in_session(add)
        say(f"Registered webhook {endpoint_id} for {endpoint_url}")
        say(f"Signing secret (shown once): {secret}")

    @admin.command("list-webhooks")
    def list_webhooks(org: Org) -> None:
        """The organisation's webhook endpoints."""
        from campaign_trigger.services import webhooks

        rows = in_session(
            lambda s: [
                (e.id, e.url, e.created_at)
                for e in webhooks.endpoints(session=s, org_id=_org_id(s, org))
            ]
        )
        if not rows:
            say(f"No webhooks for {org}.")
        for endpoint_id, url, created_at in rows:
            say(f"{endpoint_id}  {url}  (since {created_at:%Y-%m-%d %H:%M:%S}Z)")

    @admin.command("remove-webhook")
    def remove_webhook(org: Org, webhook_id: str) -> None:
        """Remove an endpoint, with its pending events and attempts."""
        from campaign_trigger.services import webhooks

        in_session(
            lambda s: webhooks.remove(session=s, org_id=_org_id(s, org), endpoint_id=webhook_id)
        )
        say(f"Removed webhook {webhook_id}.")

    @admin.command("webhook-attempts")
    def webhook_attempts(
        org: Org,
        webhook_id: str,
        limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    ) -> None:
        """An endpoint's delivery attempts, newest first."""
        from campaign_trigger.services import webhooks

        found = in_session(
            lambda s: webhooks.attempts(
                session=s, org_id=_org_id(s, org), endpoint_id=webhook_id, limit=limit
            )
        )
        if not found:
            say(f"No attempts yet for {webhook_id}.")
        for a in found:
            outcome = a.error or f"HTTP {a.status_code}"
            say(
                f"{a.attempted_at:%Y-%m-%d %H:%M:%S}Z  {a.event_type}  {a.event_id}  "
                f"request {a.request_id}  {outcome}  {a.duration_ms} ms"
            )

"""``campaign-trigger admin`` commands for an app's identity verification:
``show-identity-key``, ``rotate-identity-key``, ``set-identity-verification``.

See :mod:`campaign_trigger.services.identity_keys` and ``docs/devices-and-inbox.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sqlmodel import Session

    from campaign_trigger.store.models import App

InSession = Callable[[Callable[["Session"], Any]], Any]


def register(admin: typer.Typer, *, in_session: InSession, say: Callable[[str], None]) -> None:
    """Add the identity commands to ``admin``; ``in_session`` runs one transaction (and
    turns a refusal into exit 1), ``say`` prints."""

    def describe(app: App) -> None:
        state = "on" if app.identity_verification else "off"
        say(f"App {app.app_id}: identity verification {state}")
        say(f"Identity key: {app.identity_key}")

    @admin.command("show-identity-key")
    def show_identity_key(app_id: Annotated[str, typer.Option("--app-id")]) -> None:
        """Print the app's identity key (for your back-end) and whether verification is on."""
        from campaign_trigger.services import identity_keys

        describe(in_session(lambda s: identity_keys.show_identity_key(session=s, app_id=app_id)))

    @admin.command("rotate-identity-key")
    def rotate_identity_key(app_id: Annotated[str, typer.Option("--app-id")]) -> None:
        """Give the app a new identity key: hashes made with the old one stop working now."""
        from campaign_trigger.services import identity_keys

        describe(in_session(lambda s: identity_keys.rotate_identity_key(session=s, app_id=app_id)))

    @admin.command("set-identity-verification")
    def set_identity_verification(
        app_id: Annotated[str, typer.Option("--app-id")],
        on: Annotated[
            bool,
            typer.Option("--on/--off", help="Require an identity hash to log a user in."),
        ],
    ) -> None:
        """Turn identity verification on or off for an app's device logins."""
        from campaign_trigger.services import identity_keys

        app = in_session(
            lambda s: identity_keys.set_identity_verification(session=s, app_id=app_id, on=on)
        )
        say(f"App {app.app_id}: identity verification {'on' if on else 'off'}.")

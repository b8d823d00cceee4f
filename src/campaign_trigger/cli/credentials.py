"""``campaign-trigger admin`` commands for an app's push provider credentials:
``set-credentials``, ``remove-credentials``, ``show-app`` (never prints a secret), and
``reseal-secrets`` after a change of the service secret.

See :mod:`campaign_trigger.services.app_credentials` and ``docs/apps-and-credentials.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from sqlmodel import Session

InSession = Callable[[Callable[["Session"], Any]], Any]


def _read(path: Path, what: str, fail: Callable[[str], NoReturn]) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        fail(f"Cannot read the {what} {path}: {exc.strerror or type(exc).__name__}")
    if len(data) > 64 * 1024:
        fail(f"The {what} {path} is over 64 KB: not a key file")
    return data


def register(
    admin: typer.Typer,
    *,
    in_session: InSession,
    say: Callable[[str], None],
    fail: Callable[[str], NoReturn],
) -> None:
    """Add the credential commands to ``admin``."""

    @admin.command("set-credentials")
    def set_credentials(
        app_id: Annotated[str, typer.Option("--app-id")],
        fcm_service_account: Annotated[
            Path | None,
            typer.Option(help="Android: the Firebase service-account JSON key file."),
        ] = None,
        apns_key: Annotated[
            Path | None, typer.Option(help="iOS: the APNs signing key (.p8 file).")
        ] = None,
        key_id: Annotated[str | None, typer.Option(help="iOS: the key's id (10 chars).")] = None,
        team_id: Annotated[str | None, typer.Option(help="iOS: your Apple team id.")] = None,
        topic: Annotated[
            str | None, typer.Option(help="iOS: the app's bundle id (the apns-topic).")
        ] = None,
        development: Annotated[
            bool, typer.Option("--development", help="iOS: tokens of development builds.")
        ] = False,
    ) -> None:
        """Store an app's own provider credentials, encrypted; they replace the previous
        ones from the next chunk on, without a restart."""
        from campaign_trigger.config import get_settings
        from campaign_trigger.services import app_credentials

        settings = get_settings()
        if (fcm_service_account is None) == (apns_key is None):
            fail("Give either --fcm-service-account FILE or --apns-key FILE")
        if fcm_service_account is not None:
            if key_id or team_id or topic or development:
                fail("--key-id, --team-id, --topic and --development are for --apns-key")
            data = _read(fcm_service_account, "service-account file", fail)
            row = in_session(
                lambda s: app_credentials.set_fcm_credentials(
                    session=s, settings=settings, app_id=app_id, service_account=data
                )
            )
            say(
                f"App {app_id}: FCM credentials of project {row.project_id} "
                f"({row.client_email}) stored encrypted, version {row.version}."
            )
            return
        assert apns_key is not None
        if not key_id or not team_id or not topic:
            fail("--apns-key needs --key-id, --team-id and --topic")
        key = _read(apns_key, "APNs key", fail)
        row = in_session(
            lambda s: app_credentials.set_apns_credentials(
                session=s,
                settings=settings,
                app_id=app_id,
                key=key,
                key_id=key_id,
                team_id=team_id,
                topic=topic,
                development=development,
            )
        )
        say(
            f"App {app_id}: APNs key {row.key_id} of team {row.team_id} for {row.topic} "
            f"({row.environment.value if row.environment else ''}) stored encrypted, "
            f"version {row.version}."
        )

    @admin.command("remove-credentials")
    def remove_credentials(app_id: Annotated[str, typer.Option("--app-id")]) -> None:
        """Forget an app's own credentials (it falls back to the global ones or the sandbox)."""
        from campaign_trigger.services import app_credentials

        had = in_session(lambda s: app_credentials.remove_credentials(session=s, app_id=app_id))
        say(f"App {app_id}: " + ("credentials removed." if had else "had no credentials."))

    @admin.command("reseal-secrets")
    def reseal_secrets(
        old_secret_file: Annotated[
            Path,
            typer.Option(
                help="A file holding the previous service secret (the old CT_SECRET_KEY, or "
                "the old CT_HOME/secret.key).",
            ),
        ],
    ) -> None:
        """After a change of CT_SECRET_KEY: seal every app credential and webhook secret
        again with the current secret, in one transaction (run it with the new
        CT_SECRET_KEY set, the service stopped). A repeated run changes nothing."""
        from campaign_trigger.config import get_settings
        from campaign_trigger.services.sealed import SealError
        from campaign_trigger.services.secret_rotation import reseal_all, with_secret

        old_secret = _read(old_secret_file, "old secret file", fail).decode().strip()
        settings = get_settings()
        if not old_secret:
            fail(f"The old secret file {old_secret_file} is empty")
        old = with_secret(settings, old_secret)
        try:
            done = in_session(lambda s: reseal_all(session=s, old=old, new=settings))
        except SealError as exc:
            fail(f"Nothing changed: {exc}")
        say(
            f"Sealed again with the current secret: {done.credentials} app credentials, "
            f"{done.webhooks} webhook secrets ({done.current} already were)."
        )

    @admin.command("show-app")
    def show_app(app_id: str) -> None:
        """Show an app and its provider credentials (ids and key fingerprint, no secret)."""
        from campaign_trigger.config import get_settings
        from campaign_trigger.services import app_credentials

        settings = get_settings()
        shown = in_session(
            lambda s: app_credentials.describe_app(session=s, settings=settings, app_id=app_id)
        )
        width = max(len(name) for name in shown)
        for name, value in shown.items():
            say(f"{name.ljust(width)}  {value}")

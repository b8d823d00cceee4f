"""An app's identity verification, for operators (``campaign-trigger admin ...``).

With verification on, a device logs a user in only with the user id's identity hash:
the HMAC-SHA256 of the user id under the app's identity key, which the tenant's
back-end computes for the user it has signed in (it keeps the key; the app never
sees it). Rotating the key makes every hash made with the old one useless at once.
"""

from __future__ import annotations

from sqlmodel import Session, select

from campaign_trigger.errors import AdminError
from campaign_trigger.store.models import App, new_identity_key


def _app(*, session: Session, app_id: str) -> App:
    app = session.exec(select(App).where(App.app_id == app_id)).first()
    if app is None:
        raise AdminError(f"Unknown app {app_id!r}")
    return app


def show_identity_key(*, session: Session, app_id: str) -> App:
    """The app, whose ``identity_key`` and ``identity_verification`` the caller shows."""
    return _app(session=session, app_id=app_id)


def rotate_identity_key(*, session: Session, app_id: str) -> App:
    """Give the app a new identity key; hashes made with the old one no longer log in."""
    app = _app(session=session, app_id=app_id)
    app.identity_key = new_identity_key()
    session.add(app)
    session.flush()
    return app


def set_identity_verification(*, session: Session, app_id: str, on: bool) -> App:
    """Turn the app's identity verification on or off (devices already logged in stay)."""
    app = _app(session=session, app_id=app_id)
    app.identity_verification = on
    session.add(app)
    session.flush()
    return app

"""Device registry and in-app inbox routes for app SDKs.

Every call carries ``X-App-Key: <App.sdk_key>`` (a missing or unknown key, or the key
of another app than the one named, is refused with 401). Registering a device answers
its **device secret**, once; every later call about the device carries it as
``X-Device-Secret`` (401 when it does not match, answered alike for an unknown device).
With the app's identity verification on, logging a user in also needs the user's
identity hash from the tenant's back-end. See ``docs/devices-and-inbox.md``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.security import APIKeyHeader

from campaign_trigger.api.deps import SessionDep
from campaign_trigger.errors import InvalidInput
from campaign_trigger.schemas.api import ErrorBody
from campaign_trigger.schemas.devices import (
    DeviceLogin,
    DevicePublic,
    DevicePush,
    DeviceRegistered,
    DeviceRegistration,
    InboxItem,
    InboxPage,
)
from campaign_trigger.services import devices
from campaign_trigger.services.inbox import MAX_PAGE, fetch_inbox
from campaign_trigger.store.models import App, Device

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid input"},
    401: {
        "model": ErrorBody,
        "description": "Missing or wrong app key, device secret or identity hash",
    },
    413: {"model": ErrorBody, "description": "Body over the 8 KB allowed"},
}
_TAKEN: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorBody,
        "description": "The device id is registered already and no device secret was sent",
    }
}

AppKey = Annotated[
    str | None,
    Depends(APIKeyHeader(name="X-App-Key", auto_error=False, description="The app's SDK key")),
]
DeviceSecret = Annotated[
    str | None,
    Depends(
        APIKeyHeader(
            name="X-Device-Secret",
            auto_error=False,
            description="The device secret that registering the device answered",
        )
    ),
]
AppId = Annotated[str, Path(max_length=200, description="The app, as named by the operator.")]
DeviceId = Annotated[str, Path(max_length=200, description="The device, as registered.")]

router = APIRouter(prefix="/api", tags=["devices"], responses=_ERRORS)


def authenticated_device(
    app_id: AppId,
    device_id: DeviceId,
    app_key: AppKey,
    device_secret: DeviceSecret,
    session: SessionDep,
) -> tuple[App, Device]:
    """The app of the key and its device of the secret (401 otherwise)."""
    app = devices.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
    device = devices.authenticate_device(
        session=session, app_id=app.app_id, device_id=device_id, device_secret=device_secret
    )
    return app, device


AppDevice = Annotated[tuple[App, Device], Depends(authenticated_device)]


@router.post("/apps/{app_id}/devices", response_model=DeviceRegistered, responses=_TAKEN)
def register_device(
    app_id: AppId,
    registration: DeviceRegistration,
    app_key: AppKey,
    device_secret: DeviceSecret,
    session: SessionDep,
) -> DeviceRegistered:
    """Register a device (its device secret comes back, once), or update its push token
    with its secret (a new token clears an unregistered one)."""
    app = devices.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
    registered = devices.register_device(
        session=session,
        app_id=app.app_id,
        device_id=registration.device_id,
        push_token=registration.push_token,
        device_secret=device_secret,
    )
    return DeviceRegistered.registered(registered.device, registered.device_secret)


@router.put("/apps/{app_id}/devices/{device_id}/user", response_model=DevicePublic)
def log_in_user(login: DeviceLogin, app_device: AppDevice, session: SessionDep) -> DevicePublic:
    """Log a user in on the device (with identity verification on: its identity hash)."""
    app, device = app_device
    logged_in = devices.log_in(
        session=session,
        app=app,
        device=device,
        user_id=login.user_id,
        identity_hash=login.identity_hash,
    )
    return DevicePublic.of(logged_in)


@router.delete("/apps/{app_id}/devices/{device_id}/user", response_model=DevicePublic)
def log_out_user(app_device: AppDevice, session: SessionDep) -> DevicePublic:
    """Log the user out of the device."""
    _, device = app_device
    return DevicePublic.of(devices.log_out(session=session, device=device))


@router.put("/apps/{app_id}/devices/{device_id}/push", response_model=DevicePublic)
def update_push_opt_in(
    push: DevicePush, app_device: AppDevice, session: SessionDep
) -> DevicePublic:
    """Opt the device in to push notifications, or out."""
    _, device = app_device
    changed = devices.set_opt_in(session=session, device=device, opted_in=push.opted_in)
    return DevicePublic.of(changed)


@router.post("/apps/{app_id}/devices/{device_id}/uninstall", response_model=DevicePublic)
def report_uninstall(app_device: AppDevice, session: SessionDep) -> DevicePublic:
    """Report that the app was uninstalled from the device."""
    _, device = app_device
    return DevicePublic.of(devices.uninstall(session=session, device=device))


@router.get("/inapp/messages", response_model=InboxPage, tags=["inapp"])
def read_inbox(
    app_key: AppKey,
    device_secret: DeviceSecret,
    session: SessionDep,
    device_id: Annotated[str, Query(min_length=1, max_length=200)],
    app_id: Annotated[
        str | None, Query(max_length=200, description="Checked against the key if given")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> InboxPage:
    """A page of the in-app messages of the user logged in on the device, newest first
    (none while nobody is logged in), with their data and image; expired ones are left out."""
    app = devices.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
    device = devices.authenticate_device(
        session=session, app_id=app.app_id, device_id=device_id, device_secret=device_secret
    )
    try:
        page, next_cursor = fetch_inbox(
            session=session,
            app_id=app.app_id,
            device_id=device.device_id,
            user_id=device.user_id if device.logged_in else None,
            limit=limit,
            cursor=cursor,
        )
    except ValueError:
        raise InvalidInput("Invalid cursor") from None
    items = [
        InboxItem(
            id=message.id or 0,
            campaign_id=message.campaign_id,
            request_id=message.request_id,
            title=message.title,
            body=message.body,
            data=message.data,
            image=message.image,
            sent_at=message.published_at,
            expires_at=message.expires_at,
        )
        for message in page
    ]
    return InboxPage(messages=items, next_cursor=next_cursor)

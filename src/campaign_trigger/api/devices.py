"""Device registry and in-app inbox routes for app SDKs, authenticated by the app's SDK key.

Every call carries ``X-App-Key: <App.sdk_key>``; a missing or unknown key, or the key
of another app than the one in the path, is refused with 401.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, Field

from campaign_trigger.delivery import registry
from campaign_trigger.delivery.inapp import MAX_PAGE, fetch_inbox
from campaign_trigger.errors import InvalidInput
from campaign_trigger.schemas.api import ErrorBody
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Device

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid input"},
    401: {"model": ErrorBody, "description": "Missing or wrong app key"},
}

AppKey = Annotated[
    str | None,
    Depends(APIKeyHeader(name="X-App-Key", auto_error=False, description="The app's SDK key")),
]

router = APIRouter(prefix="/api", tags=["devices"], responses=_ERRORS)


class DeviceRegistration(BaseModel):
    """A device reporting its install and current push token."""

    device_id: str = Field(min_length=1, max_length=200)
    push_token: str | None = Field(default=None, min_length=1, max_length=4096)


class DeviceLogin(BaseModel):
    """The user who logged in on the device."""

    user_id: str = Field(min_length=1, max_length=200)


class DevicePush(BaseModel):
    """Push permission on the device."""

    opted_in: bool


class DevicePublic(BaseModel):
    """A device as the registry knows it."""

    app_id: str
    device_id: str
    user_id: str | None
    logged_in: bool
    opted_in: bool
    has_push_token: bool
    unregistered: bool = Field(description="Its push token came back unregistered")
    uninstalled: bool
    updated_at: datetime

    @classmethod
    def of(cls, device: Device) -> DevicePublic:
        return cls(
            app_id=device.app_id,
            device_id=device.device_id,
            user_id=device.user_id,
            logged_in=device.logged_in,
            opted_in=device.opted_in,
            has_push_token=bool(device.push_token),
            unregistered=device.unregistered_at is not None,
            uninstalled=device.uninstalled_at is not None,
            updated_at=device.updated_at,
        )


class InboxItem(BaseModel):
    """One in-app message."""

    id: int
    campaign_id: str
    request_id: str
    title: str
    body: str
    sent_at: datetime


class InboxPage(BaseModel):
    """A page of a device's inbox, newest first."""

    messages: list[InboxItem]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end"
    )


@router.post("/apps/{app_id}/devices", response_model=DevicePublic)
def register_device(app_id: str, registration: DeviceRegistration, app_key: AppKey) -> DevicePublic:
    """Register a device or update its push token (a new token clears an unregistered one)."""
    with session_scope() as session:
        app = registry.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
        device = registry.register_device(
            session=session,
            app_id=app.app_id,
            device_id=registration.device_id,
            push_token=registration.push_token,
        )
        return DevicePublic.of(device)


@router.put("/apps/{app_id}/devices/{device_id}/user", response_model=DevicePublic)
def log_in_user(app_id: str, device_id: str, login: DeviceLogin, app_key: AppKey) -> DevicePublic:
    """Log a user in on the device."""
    with session_scope() as session:
        app = registry.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
        device = registry.get_device(session=session, app_id=app.app_id, device_id=device_id)
        return DevicePublic.of(
            registry.log_in(session=session, device=device, user_id=login.user_id)
        )


@router.delete("/apps/{app_id}/devices/{device_id}/user", response_model=DevicePublic)
def log_out_user(app_id: str, device_id: str, app_key: AppKey) -> DevicePublic:
    """Log the user out of the device."""
    with session_scope() as session:
        app = registry.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
        device = registry.get_device(session=session, app_id=app.app_id, device_id=device_id)
        return DevicePublic.of(registry.log_out(session=session, device=device))


@router.put("/apps/{app_id}/devices/{device_id}/push", response_model=DevicePublic)
def update_push_opt_in(
    app_id: str, device_id: str, push: DevicePush, app_key: AppKey
) -> DevicePublic:
    """Opt the device in to push notifications, or out."""
    with session_scope() as session:
        app = registry.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
        device = registry.get_device(session=session, app_id=app.app_id, device_id=device_id)
        changed = registry.set_opt_in(session=session, device=device, opted_in=push.opted_in)
        return DevicePublic.of(changed)


@router.post("/apps/{app_id}/devices/{device_id}/uninstall", response_model=DevicePublic)
def report_uninstall(app_id: str, device_id: str, app_key: AppKey) -> DevicePublic:
    """Report that the app was uninstalled from the device."""
    with session_scope() as session:
        app = registry.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
        device = registry.get_device(session=session, app_id=app.app_id, device_id=device_id)
        return DevicePublic.of(registry.uninstall(session=session, device=device))


@router.get("/inapp/messages", response_model=InboxPage, tags=["inapp"])
def read_inbox(
    app_key: AppKey,
    device_id: Annotated[str, Query(min_length=1, max_length=200)],
    app_id: Annotated[str | None, Query(description="Checked against the key if given")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> InboxPage:
    """A page of the device's in-app messages, newest first."""
    with session_scope() as session:
        app = registry.app_for_key(session=session, sdk_key=app_key, app_id=app_id)
        try:
            page, next_cursor = fetch_inbox(
                session=session, app_id=app.app_id, device_id=device_id, limit=limit, cursor=cursor
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
                sent_at=message.published_at,
            )
            for message in page
        ]
        return InboxPage(messages=items, next_cursor=next_cursor)

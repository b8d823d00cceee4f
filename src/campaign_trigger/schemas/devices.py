"""Pydantic models of the device registry and in-app inbox routes (app SDKs)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from campaign_trigger.schemas.text import StorableStr
from campaign_trigger.services.device_auth import IDENTITY_HASH_PATTERN
from campaign_trigger.store.models import Device


class DeviceRegistration(BaseModel):
    """A device reporting its install and current push token."""

    device_id: StorableStr = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[^/]+$",
        description="The install's id: a random id the SDK makes once per install is best. "
        "No `/`: later calls name the device in their path.",
    )
    push_token: StorableStr | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="The FCM registration token or APNs device token, if the app has one.",
    )


class DeviceLogin(BaseModel):
    """The user who logged in on the device."""

    user_id: StorableStr = Field(min_length=1, max_length=200)
    identity_hash: str | None = Field(
        default=None,
        pattern=IDENTITY_HASH_PATTERN,
        description="HMAC-SHA256 (hex) of `user_id` under the app's identity key, made by "
        "your back-end; required when the app has identity verification on.",
    )


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


class DeviceRegistered(DevicePublic):
    """A registered device; its device secret comes back once, when it is created."""

    device_secret: str | None = Field(
        description="Send it as `X-Device-Secret` on every later call about this device. "
        "Only its hash is kept: it is shown this once, and null on later registrations."
    )

    @classmethod
    def registered(cls, device: Device, device_secret: str | None) -> DeviceRegistered:
        return cls(**DevicePublic.of(device).model_dump(), device_secret=device_secret)


class InboxItem(BaseModel):
    """One in-app message."""

    id: int
    campaign_id: str
    request_id: str
    title: str
    body: str
    data: dict[str, str] = Field(
        default_factory=dict,
        description="The campaign's data, rendered for the user (e.g. a deep link)",
    )
    image: str | None = Field(default=None, description="The image URL, if any")
    sent_at: datetime
    expires_at: datetime | None = Field(
        default=None,
        description="Not returned after this time (the campaign's TTL); null: never expires",
    )


class InboxPage(BaseModel):
    """A page of the inbox of the user logged in on the device, newest first."""

    messages: list[InboxItem]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end"
    )

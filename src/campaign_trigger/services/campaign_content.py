"""What a campaign sends: its templates and push options, checked as a whole.

A campaign's title, body, ``data`` values and image URL are ``{{ name }}`` templates
rendered per user; every variable used anywhere is a required variable of the
campaign (a request missing one is refused with the spec's ``missing variables``
error). The other fields are the same for every message: sound, badge, priority,
TTL, the APNs interruption level, thread id and category, and the silent
(background / data-only) variant. :func:`check_content` refuses what a provider
would refuse or what makes no sense, with a one-line reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Final

from campaign_trigger.delivery.base import PushOptions
from campaign_trigger.errors import AdminError, InvalidInput
from campaign_trigger.services.templates import template_variables
from campaign_trigger.store.models import Campaign, PushPriority

INTERRUPTION_LEVELS: Final = ("passive", "active", "time-sensitive", "critical")
MAX_TTL_SECONDS: Final = 28 * 24 * 3600  # FCM keeps a message at most 4 weeks
MAX_BADGE: Final = 999_999
OUR_DATA_KEYS: Final = frozenset({"request_id", "campaign_id", "message_id"})
# FCM: "from", "notification", "message_type" and keys starting with google/gcm are
# reserved; APNs: "aps". "image" carries the image URL in APNs payloads.
_RESERVED: Final = frozenset({"from", "notification", "message_type", "aps", "image"})
_DATA_KEY: Final = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class CampaignContent:
    """A campaign's content as an operator gives it."""

    title: str = ""
    body: str = ""
    data: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    sound: str | None = None
    badge: int | None = None
    priority: str = "high"
    ttl_seconds: int | None = None
    interruption_level: str | None = None
    thread_id: str | None = None
    category: str | None = None
    silent: bool = False

    @classmethod
    def of(cls, campaign: Campaign) -> CampaignContent:
        return cls(
            title=campaign.title,
            body=campaign.body,
            data=dict(campaign.data),
            image=campaign.image,
            sound=campaign.sound,
            badge=campaign.badge,
            priority=campaign.priority.value,
            ttl_seconds=campaign.ttl_seconds,
            interruption_level=campaign.interruption_level,
            thread_id=campaign.thread_id,
            category=campaign.category,
            silent=campaign.silent,
        )

    def changed(self, **changes: Any) -> CampaignContent:
        """This content with ``changes`` (an empty string clears an optional field)."""
        cleared: dict[str, Any] = {
            name: (None if value == "" and name not in ("title", "body") else value)
            for name, value in changes.items()
        }
        return replace(self, **cleared)

    def apply(self, campaign: Campaign) -> None:
        """Write the checked content (and its variables) onto ``campaign``."""
        campaign.variables = check_content(self)
        campaign.title, campaign.body, campaign.data = self.title, self.body, dict(self.data)
        campaign.image, campaign.sound, campaign.badge = self.image, self.sound, self.badge
        campaign.priority = PushPriority(self.priority)
        campaign.ttl_seconds = self.ttl_seconds
        campaign.interruption_level = self.interruption_level
        campaign.thread_id, campaign.category = self.thread_id, self.category
        campaign.silent = self.silent


def _check_data(data: dict[str, str]) -> None:
    for key, value in data.items():
        if not _DATA_KEY.match(key):
            raise AdminError(
                f"Invalid data key {key!r}: 1 to 64 letters, digits or _ . : - characters"
            )
        lowered = key.lower()
        if key in OUR_DATA_KEYS or lowered in _RESERVED or lowered.startswith(("google", "gcm")):
            raise AdminError(
                f"Data key {key!r} is reserved (request_id, campaign_id, message_id, image, aps, "
                "from, notification, message_type, google*, gcm*)"
            )
        if not isinstance(value, str):
            raise AdminError(f"Data value of {key!r} must be a string")


def check_content(content: CampaignContent) -> list[str]:
    """Refuse content the providers would refuse; its template variables, in order."""
    if content.silent:
        shown = [
            name
            for name in ("title", "body", "image", "sound", "badge", "interruption_level")
            if getattr(content, name) not in (None, "")
        ]
        if shown:
            raise AdminError(
                f"A silent push shows nothing: it cannot have {', '.join(shown)} "
                "(Apple: a background notification holds only content-available)"
            )
        if not content.data:
            raise AdminError("A silent push needs --data: it is all the app receives")
    elif not content.title.strip() and not content.body.strip():
        raise AdminError("A campaign needs a title or a body")
    _check_data(content.data)
    if content.image is not None and not content.image.startswith("https://"):
        raise AdminError("The image must be an https:// URL (iOS loads nothing else)")
    if content.priority not in ("high", "normal"):
        raise AdminError(f"Unknown priority {content.priority!r}: expected high or normal")
    if content.badge is not None and not 0 <= content.badge <= MAX_BADGE:
        raise AdminError(f"The badge must be a number from 0 to {MAX_BADGE}")
    if content.ttl_seconds is not None and not 0 <= content.ttl_seconds <= MAX_TTL_SECONDS:
        raise AdminError(f"The TTL must be 0 to {MAX_TTL_SECONDS} seconds (FCM keeps 4 weeks)")
    if content.interruption_level not in (None, *INTERRUPTION_LEVELS):
        raise AdminError(
            f"Unknown interruption level {content.interruption_level!r}: expected one of "
            + ", ".join(INTERRUPTION_LEVELS)
        )
    for name in ("sound", "thread_id", "category"):
        value = getattr(content, name)
        if value is not None and (not value.strip() or len(value) > 200):
            raise AdminError(f"The {name.replace('_', ' ')} must be 1 to 200 characters")
    try:
        return template_variables(
            content.title, content.body, *content.data.values(), content.image or ""
        )
    except InvalidInput as exc:
        raise AdminError(exc.message) from None


def push_options(campaign: Campaign) -> PushOptions:
    """The options every push of the campaign carries."""
    return PushOptions(
        priority="normal" if campaign.priority == PushPriority.normal else "high",
        ttl_seconds=campaign.ttl_seconds,
        sound=campaign.sound,
        badge=campaign.badge,
        interruption_level=campaign.interruption_level,
        thread_id=campaign.thread_id,
        category=campaign.category,
        silent=campaign.silent,
    )

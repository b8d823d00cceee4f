"""``send_at`` of a trigger call: ISO 8601 basic or extended, always with a UTC offset."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from campaign_trigger.errors import InvalidInput

PAST_TOLERANCE = timedelta(minutes=5)

_OFFSET = r"(?P<offset>Z|[+-]\d{2}(?::?\d{2})?)"
_BASIC = re.compile(
    r"(?P<Y>\d{4})(?P<m>\d{2})(?P<d>\d{2})T(?P<H>\d{2})(?P<M>\d{2})(?P<S>\d{2})"
    r"(?:[.,](?P<frac>\d{1,6}))?" + _OFFSET,
    re.ASCII,
)
_EXTENDED = re.compile(
    r"(?P<Y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})T(?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})"
    r"(?:[.,](?P<frac>\d{1,6}))?" + _OFFSET,
    re.ASCII,
)

INVALID_TIME = "Invalid time format"
IN_THE_PAST = "The delivery time is in the past, please change it"


def _offset(text: str) -> timezone:
    if text == "Z":
        return UTC
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
    if hours > 23 or minutes > 59:
        raise ValueError("offset out of range")
    return timezone(sign * timedelta(hours=hours, minutes=minutes))


def parse_send_at(text: str) -> datetime:
    """The instant ``text`` names, timezone-aware (UTC). Raises InvalidInput otherwise."""
    match = _BASIC.fullmatch(text) or _EXTENDED.fullmatch(text)
    if match is None:
        raise InvalidInput(INVALID_TIME)
    part = match.groupdict()
    try:
        moment = datetime(
            int(part["Y"]),
            int(part["m"]),
            int(part["d"]),
            int(part["H"]),
            int(part["M"]),
            int(part["S"]),
            int((part["frac"] or "0").ljust(6, "0")),
            tzinfo=_offset(part["offset"]),
        )
        return moment.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise InvalidInput(INVALID_TIME) from exc


def resolve_send_at(value: object, *, now: datetime) -> datetime:
    """When to send: ``now`` when absent or at most 5 minutes past, else the given instant."""
    if value is None:
        return now
    if not isinstance(value, str):
        raise InvalidInput(INVALID_TIME)
    moment = parse_send_at(value)
    if moment < now - PAST_TOLERANCE:
        raise InvalidInput(IN_THE_PAST)
    return max(moment, now)

"""Decoding a JSON body meant to hold messages: numbers keep their text
(:mod:`~campaign_trigger.services.json_text`), and decoding stops early when the body
holds far more objects than ``json_messages_cap`` messages need."""

from __future__ import annotations

from typing import Any

from campaign_trigger.errors import InvalidInput
from campaign_trigger.services import json_text


class _TooManyObjects(Exception):
    pass


def too_many_messages(cap: int) -> InvalidInput:
    return InvalidInput(
        f"Too many messages: at most {cap} per JSON call; send them as a CSV file "
        "(multipart/form-data, form key 'file')"
    )


def decode_messages_json(raw: bytes | str, *, cap: int) -> Any:
    """Decode JSON meant to hold at most ``cap`` messages. The decoder stops at the first
    object past twice what ``cap`` messages need (each message and its variables are
    two objects), so a body of a million ``{}`` costs no more than a legal one; a body
    just over the cap is decoded, and refused with the count. ValueError if malformed."""
    budget = 4 * cap + 16
    seen = 0

    def count(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal seen
        seen += 1
        if seen > budget:
            raise _TooManyObjects
        return obj

    try:
        return json_text.loads(raw, object_hook=count)  # numbers keep their text
    except _TooManyObjects:
        raise too_many_messages(cap) from None
    except RecursionError as exc:
        raise ValueError("too deeply nested") from exc

"""A trigger call as received, and the checks of its members (the spec's error texts).

:class:`TriggerInput` is what the API (or the ``send-batch`` flow) hands the create
use case (:mod:`campaign_trigger.services.requests`), values as the caller sent them;
the functions here check one member each.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from campaign_trigger.errors import InvalidInput
from campaign_trigger.services.json_text import JsonFloat, JsonInt
from campaign_trigger.services.uploads import StoredUpload

NO_CAMPAIGN_ID = "You must provide a campaign identifier"
EMPTY_CAMPAIGN_ID = "Empty campaign identifier"
CAMPAIGN_ID_NOT_STRING = "Campaign identifier must be a String"
NEITHER = "Must provide JSON messages or a CSV file"
BOTH = "Must provide either JSON messages or a CSV file"
USER_ID_MISSING = "Invalid messages : 'user_id' key is missing"
MAX_USER_ID = 200


def missing_variables_error(missing: Sequence[str]) -> InvalidInput:
    """The error naming the template's variables that no message or file column holds."""
    return InvalidInput(f"Invalid file : missing variables : ({', '.join(missing)})")


class Missing:
    """Marks a member the caller did not send (``null`` counts as not sent)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = Missing()


class UnreadableMessages:
    """A ``messages`` form field that is not JSON."""


@dataclass
class TriggerInput:
    """A trigger call as received, before any check (values as the caller sent them).

    The CSV file is either already streamed to storage by the API (``upload``), or a
    file in storage to copy when the checks reach it (``source_key``: send-batch).
    """

    campaign_id: object = MISSING
    send_at: object = None
    messages: object = MISSING
    upload: StoredUpload | None = None
    source_key: str | None = None
    file_member: bool = False  # a JSON body that also names a `file`
    extra_files: int = 0  # a form's files under `file` after the first (refused)
    idempotency_key: str | None = None
    body_hash: str | None = None


def body_hash(payload: object) -> str:
    """A stable hash of a request body, for idempotency keys: a number counts as written
    (``2.00`` is not ``2.0``: each is delivered as written) where that differs from how
    json writes it back (the hash of any other body as it always was)."""
    text = json.dumps(_as_written(payload), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _as_written(value: object) -> object:
    if isinstance(value, JsonFloat | JsonInt):
        plain = float(value) if isinstance(value, JsonFloat) else int(value)
        return value.text if json.dumps(plain) != value.text else plain
    if isinstance(value, dict):
        return {key: _as_written(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_written(item) for item in value]
    return value


def check_campaign_id(value: object) -> str:
    if value is MISSING or value is None:
        raise InvalidInput(NO_CAMPAIGN_ID)
    if not isinstance(value, str):
        raise InvalidInput(CAMPAIGN_ID_NOT_STRING)
    if not value.strip():
        raise InvalidInput(EMPTY_CAMPAIGN_ID)
    return value


def _is_scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)  # 1e999 parses as infinity: no JSON can store it
    return value is None or isinstance(value, str | int | bool)


def _is_unicode(text: str) -> bool:
    """False for a string holding a lone surrogate (JSON allows ``"\\ud800"``)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_messages(value: object, *, variables: Sequence[str], cap: int) -> list[dict[str, Any]]:
    """JSON messages as ``{user_id, template_variables}`` dicts, or InvalidInput."""
    if isinstance(value, UnreadableMessages):
        raise InvalidInput("Invalid messages : the messages field is not valid JSON")
    if not isinstance(value, list):
        raise InvalidInput("Invalid messages : messages must be an array of objects")
    if not value:
        raise InvalidInput(NEITHER)
    if len(value) > cap:
        raise InvalidInput(
            f"Too many messages: at most {cap} per JSON call ({len(value)} given); "
            "send them as a CSV file (multipart/form-data, form key 'file')"
        )
    messages: list[dict[str, Any]] = []
    missing: set[str] = set()
    for message in value:
        if not isinstance(message, dict):
            raise InvalidInput("Invalid messages : each message must be an object")
        if "user_id" not in message or message["user_id"] is None:
            raise InvalidInput(USER_ID_MISSING)
        user_id = message["user_id"]
        if not isinstance(user_id, str):
            raise InvalidInput("Invalid messages : 'user_id' must be a String")
        if not user_id.strip() or "\x00" in user_id:
            raise InvalidInput("Invalid messages : 'user_id' is empty")
        if not _is_unicode(user_id):
            raise InvalidInput("Invalid messages : 'user_id' is not valid Unicode")
        if len(user_id) > MAX_USER_ID:
            raise InvalidInput(
                f"Invalid messages : 'user_id' is longer than {MAX_USER_ID} characters"
            )
        variables_in = message.get("template_variables")
        if variables_in is None:
            variables_in = {}
        if not isinstance(variables_in, dict):
            raise InvalidInput("Invalid messages : 'template_variables' must be an object")
        if not all(_is_scalar(v) for v in variables_in.values()):
            raise InvalidInput(
                "Invalid messages : template variable values must be strings or numbers"
            )
        for name, value in variables_in.items():
            if not _is_unicode(name) or (isinstance(value, str) and not _is_unicode(value)):
                raise InvalidInput(
                    "Invalid messages : template variables must be valid Unicode text"
                )
            if isinstance(value, str) and "\x00" in value:  # as a CSV file's NUL byte
                raise InvalidInput(
                    "Invalid messages : template variables must not hold a NUL character"
                )
        missing.update(name for name in variables if name not in variables_in)
        messages.append({"user_id": user_id, "template_variables": variables_in})
    if missing:
        raise missing_variables_error([name for name in variables if name in missing])
    return messages

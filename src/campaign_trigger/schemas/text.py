"""Text the service can store, hash and echo back: no lone surrogates, no NUL characters.

JSON lets a string hold a lone UTF-16 surrogate (``"\\ud800"``): Python decodes it into
a ``str`` that cannot be encoded as UTF-8, so the database driver, a password hash or
the JSON answer echoing it would fail. PostgreSQL text refuses NUL. Such text is
refused at the edge (400), or, for identifiers that are only looked up, treated as
unknown without a query.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import AfterValidator

UNSTORABLE: Final = "must be Unicode text without lone surrogates or NUL characters"
LONE_SURROGATE: Final = (
    "Invalid JSON body: every string must be valid Unicode text (no lone surrogates)"
)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_MAX_DEPTH: Final = 64


def has_lone_surrogate(value: str) -> bool:
    """Whether ``value`` cannot be encoded as UTF-8 (it holds a lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def storable(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 and holds no NUL character."""
    return "\x00" not in value and not has_lone_surrogate(value)


def holds_lone_surrogate(document: object, *, raw: bytes | None = None) -> bool:
    """Whether any key or string value of a decoded JSON document holds a lone surrogate.

    With ``raw`` (the body the document was decoded from), documents without a
    ``\\uD800``-``\\uDFFF`` escape are answered without walking them.
    """
    if raw is not None and _SURROGATE_ESCAPE.search(raw) is None:
        return False
    return _walk(document, 0)


def _walk(value: object, depth: int) -> bool:
    if isinstance(value, str):
        return has_lone_surrogate(value)
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return any(_walk(k, depth + 1) or _walk(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return any(_walk(item, depth + 1) for item in value)
    return False


def printable(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so it can be sent as UTF-8."""
    if not has_lone_surrogate(text):
        return text
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


def _check_storable(value: str) -> str:
    if not storable(value):
        raise ValueError(UNSTORABLE)
    return value


StorableStr = Annotated[str, AfterValidator(_check_storable)]
"""A ``str`` field of a request body that must be storable (see :func:`storable`)."""

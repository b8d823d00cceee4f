"""JSON template variables as text: what the caller wrote is what is delivered.

A message's ``template_variables`` may hold strings, numbers, booleans and null.
Rendering uses their text: a string as is (byte for byte), a number as it was
written in the JSON body (``2.00`` stays ``2.00``, ``1e3`` stays ``1e3``), a boolean
as ``true``/``false``, null as the empty string. :func:`loads` keeps each number's
original text beside its value (:class:`JsonFloat`, :class:`JsonInt` behave as
``float`` and ``int`` everywhere else); numbers that did not come through it (a call
from Python) use their JSON form (``json.dumps``). :func:`dumps` writes such numbers back
as their text: the database's JSON columns keep a request's variables as they were sent
(the scheduled list and the cancel answer show ``2.00``, not ``2.0``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class JsonFloat(float):
    """A float that remembers how it was written."""

    text: str

    def __new__(cls, text: str) -> JsonFloat:
        number = super().__new__(cls, text)
        number.text = text
        return number


class JsonInt(int):
    """An int that remembers how it was written (``-0`` stays ``-0``)."""

    text: str

    def __new__(cls, text: str) -> JsonInt:
        number = super().__new__(cls, text)
        number.text = text
        return number


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: str | bytes, *, object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """``json.loads``, with numbers that keep their text; ``NaN``/``Infinity`` refused
    (ValueError, as for any malformed JSON). ``object_hook`` as for ``json.loads`` (the
    API counts objects with it, to stop decoding a body far over the message cap)."""
    return json.loads(
        data,
        object_hook=object_hook,
        parse_float=JsonFloat,
        parse_int=JsonInt,
        parse_constant=_not_json,
    )


def as_text(value: object) -> str:
    """The text a template variable's value renders as (see the module docstring)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, JsonFloat | JsonInt):
        return value.text
    return json.dumps(value, allow_nan=False)


def dumps(value: Any) -> str:
    """``json.dumps(value)``, each number that kept its text (:func:`loads`) written as
    that text: valid JSON, since the text came from a JSON body. The engines' JSON
    serializer (``store/db.py``)."""
    if isinstance(value, JsonFloat | JsonInt):
        return value.text
    if isinstance(value, dict):
        if not any(isinstance(item, JsonFloat | JsonInt | dict | list) for item in value.values()):
            return json.dumps(value)  # the common case, in C
        items = (f"{json.dumps(str(key))}: {dumps(item)}" for key, item in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(dumps(item) for item in value) + "]"
    return json.dumps(value)

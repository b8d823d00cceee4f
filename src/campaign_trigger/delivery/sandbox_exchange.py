"""What the sandbox's protocol layers hand its routes, and what they get back.

HTTP/1.1 (``sandbox_http1.py``) and HTTP/2 (``sandbox_http2.py``) both turn a complete
request into a :class:`Request` and send the :class:`Reply` a route returns; routes
(``sandbox_routes.py``) never see the wire. Header names are lower-case bytes; a header
sent more than once is kept once in ``headers`` and named in ``repeated`` (APNs answers
``DuplicateHeaders``).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import orjson

JSON_TYPE: Final = b"application/json; charset=UTF-8"
HTTP2_REQUIRED: Final = 0
"""The status of a :class:`Reply` for a route that exists only over HTTP/2 (APNs): the
HTTP/1.1 layer then answers as an HTTP/2-only server would (its preface and GOAWAY
PROTOCOL_ERROR with the reply's body as debug data) and closes the connection."""


class Request(NamedTuple):
    """One complete request."""

    method: bytes
    path: bytes  # without the query string
    query: bytes
    headers: dict[bytes, bytes]
    repeated: frozenset[bytes]
    body: bytes
    http_version: str  # "1.1" or "2"
    scheme: str  # "http" or "https"
    authority: str  # Host / :authority, as sent


class Reply(NamedTuple):
    """A complete answer; ``delayed`` answers wait for the configured latency."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    delayed: bool = False


def json_reply(
    status: int,
    body: Any,
    *,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    delayed: bool = False,
) -> Reply:
    """A JSON answer (``Content-Type: application/json; charset=UTF-8``)."""
    return Reply(
        status, ((b"content-type", JSON_TYPE), *headers), orjson.dumps(body), delayed=delayed
    )


def split_target(target: bytes) -> tuple[bytes, bytes]:
    """``/path?query`` → (path, query)."""
    path, _, query = target.partition(b"?")
    return path, query

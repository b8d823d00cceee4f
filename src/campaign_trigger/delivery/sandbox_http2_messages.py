"""HTTP/2 requests and answers (RFC 9113 §8) for the sandbox's server side: a decoded
header list to a :class:`~campaign_trigger.delivery.sandbox_exchange.Request`, and a
:class:`~campaign_trigger.delivery.sandbox_exchange.Reply` to the header block we send."""

from __future__ import annotations

from typing import Final

from campaign_trigger.delivery.hpack_plain import encode_header
from campaign_trigger.delivery.sandbox_exchange import Reply, Request, split_target

# connection-specific fields are malformed in HTTP/2 (§8.2.2)
_FORBIDDEN: Final = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
# :status values of the HPACK static table (RFC 7541 Appendix A), fully indexed
_STATUS: Final = {
    200: b"\x88",
    204: b"\x89",
    206: b"\x8a",
    304: b"\x8b",
    400: b"\x8c",
    404: b"\x8d",
    500: b"\x8e",
}


def request_from_headers(
    headers: list[tuple[bytes, bytes]], body: list[bytes], scheme: str
) -> Request | None:
    """The request, or None if it is malformed (§8.1.1: a stream error, PROTOCOL_ERROR):
    an unknown or late pseudo-header, an upper-case or connection-specific field, no
    ``:method`` or ``:path``."""
    method = path = authority = b""
    fields: dict[bytes, bytes] = {}
    repeated: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return None
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b":authority":
                authority = value
            elif name == b":scheme":
                scheme = value.decode("latin-1")
            else:
                return None
            continue
        regular = True
        if name in _FORBIDDEN or name.lower() != name:
            return None
        if name in fields and name != b"cookie":  # cookies may be split (§8.2.3)
            repeated.add(name)
        fields[name] = value
    if not method or not path:
        return None
    target, query = split_target(path)
    return Request(
        method,
        target,
        query,
        fields,
        frozenset(repeated),
        b"".join(body),
        "2",
        scheme,
        (authority or fields.get(b"host", b"")).decode("latin-1"),
    )


def answer_header_block(reply: Reply) -> bytes:
    """The HPACK block of an answer: status, headers, and content-length for a body."""
    status = _STATUS.get(reply.status) or encode_header(b":status", b"%d" % reply.status)
    block = status + b"".join(encode_header(name, value) for name, value in reply.headers)
    if reply.body:
        block += encode_header(b"content-length", b"%d" % len(reply.body))
    return block

"""HTTP/2 frame constants and builders shared by the sandbox's server side (RFC 9113 §6)."""

from __future__ import annotations

import enum
import struct
from typing import Final, NamedTuple

MAX_CONCURRENT_STREAMS: Final = 1000
CONNECTION_WINDOW: Final = 16 * 1024 * 1024  # what we let a client send before it waits
HEADER_TABLE_SIZE: Final = 4096
MAX_HEADER_LIST_SIZE: Final = 65536

_HEADER = struct.Struct(">BHBBL")


class FrameType(enum.IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class Frame(NamedTuple):
    kind: int
    flags: int
    stream_id: int
    payload: bytes


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """One frame on the wire."""
    length = len(payload)
    return _HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id) + payload


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    """A GOAWAY frame."""
    return frame(FrameType.GOAWAY, 0, 0, struct.pack(">LL", last_stream_id, code) + debug)


def server_preface() -> bytes:
    """Our SETTINGS, and a connection WINDOW_UPDATE up to :data:`CONNECTION_WINDOW`."""
    settings = b"".join(
        struct.pack(">HL", code, value)
        for code, value in (
            (Setting.MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
            (Setting.HEADER_TABLE_SIZE, HEADER_TABLE_SIZE),
            (Setting.MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST_SIZE),
            (Setting.ENABLE_PUSH, 0),
        )
    )
    increment = struct.pack(">L", CONNECTION_WINDOW - 65535)
    return frame(FrameType.SETTINGS, 0, 0, settings) + frame(
        FrameType.WINDOW_UPDATE, 0, 0, increment
    )


def http2_only_refusal(why: bytes) -> bytes:
    """What an HTTP/2-only server writes to a client speaking anything else: its preface
    and GOAWAY PROTOCOL_ERROR (the client then sees no HTTP/1.1 status line)."""
    return server_preface() + goaway(0, ErrorCode.PROTOCOL_ERROR, why)

"""Connection-control frames of the sandbox's HTTP/2 server: SETTINGS, PING, GOAWAY,
WINDOW_UPDATE, RST_STREAM, PRIORITY, PUSH_PROMISE and unknown types (RFC 9113 §6)."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Protocol

from campaign_trigger.delivery.sandbox_http2_frames import (
    ErrorCode,
    Frame,
    FrameType,
    Setting,
    frame,
)

_ACK = 0x1
_MAX_WINDOW = 2**31 - 1


class ProtocolViolation(Exception):
    """A connection error (§5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: ErrorCode, why: str) -> None:
        super().__init__(why)
        self.code = code


class StreamWindow(Protocol):
    """A stream's send window (mutable)."""

    @property
    def send_window(self) -> int: ...

    @send_window.setter
    def send_window(self, value: int) -> None: ...


class ControlTarget(Protocol):
    """What the control frames change on a connection."""

    _out: list[bytes]
    _send_window: int
    _initial_send_window: int
    _max_frame: int
    _last_stream: int
    _peer_gone: bool

    @property
    def _stream_windows(self) -> Mapping[int, StreamWindow]: ...

    def _drop_stream(self, sid: int) -> None: ...

    def _ping_acknowledged(self, payload: bytes) -> None: ...

    def resume_sending(self) -> None: ...

    def _stream_error(self, sid: int, code: ErrorCode) -> None: ...


def control_frame(conn: ControlTarget, f: Frame) -> None:
    """Apply one control frame; raises :class:`ProtocolViolation` on a connection error."""
    kind, flags, sid, payload = f
    if kind == FrameType.SETTINGS:
        _settings(conn, flags, sid, payload)
    elif kind == FrameType.WINDOW_UPDATE:
        _window_update(conn, sid, payload)
    elif kind == FrameType.PING:
        if sid != 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & _ACK:
            conn._ping_acknowledged(payload)
        else:
            conn._out.append(frame(FrameType.PING, _ACK, 0, payload))
    elif kind == FrameType.RST_STREAM:
        if sid == 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if sid > conn._last_stream:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        conn._drop_stream(sid)
    elif kind == FrameType.PRIORITY:
        if sid == 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            conn._stream_error(sid, ErrorCode.FRAME_SIZE_ERROR)
    elif kind == FrameType.GOAWAY:
        if sid != 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        conn._peer_gone = True
    elif kind == FrameType.PUSH_PROMISE:
        raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
    # other frame types are ignored (§4.1, §5.5)


def _settings(conn: ControlTarget, flags: int, sid: int, payload: bytes) -> None:
    if sid != 0:
        raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
    if flags & _ACK:
        if payload:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        return
    if len(payload) % 6:
        raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
    for offset in range(0, len(payload), 6):
        code, value = struct.unpack_from(">HL", payload, offset)
        if code == Setting.ENABLE_PUSH and value > 1:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
        if code == Setting.INITIAL_WINDOW_SIZE:
            if value > _MAX_WINDOW:
                raise ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
            delta = value - conn._initial_send_window
            conn._initial_send_window = value
            for stream in conn._stream_windows.values():
                stream.send_window += delta
        elif code == Setting.MAX_FRAME_SIZE:
            if not 16384 <= value <= 16777215:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
            conn._max_frame = value
    conn._out.append(frame(FrameType.SETTINGS, _ACK, 0, b""))
    conn.resume_sending()


def _window_update(conn: ControlTarget, sid: int, payload: bytes) -> None:
    if len(payload) != 4:
        raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
    increment = struct.unpack(">L", payload)[0] & _MAX_WINDOW
    if sid == 0:
        if increment == 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        conn._send_window += increment
        if conn._send_window > _MAX_WINDOW:
            raise ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
    else:
        stream = conn._stream_windows.get(sid)
        if increment == 0:
            conn._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
            return
        if stream is None:
            if sid > conn._last_stream:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on idle stream")
            return  # a stream we already answered
        stream.send_window += increment
        if stream.send_window > _MAX_WINDOW:
            conn._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR)
            return
    conn.resume_sending()

"""Reading a trigger call's body: JSON, or multipart form-data streamed part by part.

The multipart stream is parsed with ``python_multipart``'s streaming parser over
``request.stream()``: the file part under the key ``file`` goes straight to storage
(:class:`~campaign_trigger.services.uploads.UploadWriter`, 1 MB pieces written from a
worker thread), form fields are kept (small, bounded). Nothing is spooled, and the
body is counted against the upload limit as it arrives.

A JSON body is bounded before it is parsed (:mod:`campaign_trigger.api.limits`), and
parsing stops at the first object past what ``json_messages_cap`` messages can hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from anyio import to_thread
from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from campaign_trigger.api.json_body import decode_messages_json
from campaign_trigger.errors import InvalidInput, PayloadTooLarge
from campaign_trigger.schemas.text import LONE_SURROGATE, holds_lone_surrogate
from campaign_trigger.services.trigger_input import (
    MISSING,
    TriggerInput,
    UnreadableMessages,
    body_hash,
)
from campaign_trigger.services.uploads import TOO_LARGE, StoredUpload, UploadWriter
from campaign_trigger.store.files import Storage

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

MAX_FIELD_BYTES = 64 << 10
MAX_PARTS = 32
MESSAGES_FIELD = "messages"
FILE_KEY = "file"
PLAIN_BODY = (
    "The CSV file must be attached as multipart/form-data under the form key 'file' "
    "(a plain request body is not accepted); JSON messages need Content-Type: "
    "application/json"
)
MALFORMED_JSON = "Malformed JSON body"
MALFORMED_FORM = "Malformed multipart/form-data body"


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_json_input(
    request: Request, *, cap: int, idempotency_key: str | None
) -> TriggerInput:
    """A JSON trigger call (method A); the body's size is bounded by the body limits."""
    chunks: list[bytes] = [chunk async for chunk in request.stream()]
    raw = b"".join(chunks)
    try:
        payload = decode_messages_json(raw, cap=cap)
    except ValueError as exc:
        raise InvalidInput(MALFORMED_JSON) from exc
    if holds_lone_surrogate(payload, raw=raw):
        raise InvalidInput(LONE_SURROGATE)
    if not isinstance(payload, dict):
        raise InvalidInput("The JSON body must be an object")
    return TriggerInput(
        campaign_id=payload.get("campaign_id", MISSING),
        send_at=payload.get("send_at"),
        messages=payload.get("messages", MISSING),
        file_member="file" in payload,
        idempotency_key=idempotency_key,
        body_hash=body_hash(payload) if idempotency_key else None,
    )


@dataclass
class _Part:
    headers: dict[str, bytes] = field(default_factory=dict)
    name: str = ""
    filename: str | None = None
    content_type: str | None = None
    data: list[bytes] = field(default_factory=list)
    size: int = 0


class _FormReceiver:
    """Callbacks of the multipart parser; collects fields, feeds the file to the writer.

    A field holds at most MAX_FIELD_BYTES, but ``messages`` (JSON messages sent as a
    form field) as much as a JSON body may.
    """

    def __init__(self, writer: UploadWriter, *, messages_bytes: int) -> None:
        self.writer = writer
        self.messages_bytes = messages_bytes
        self.fields: dict[str, list[str]] = {}
        self.upload: _Part | None = None
        self.extra_files = 0  # files under `file` after the first: counted, dropped, refused
        self.parts = 0
        self.flush_due = False
        self._part = _Part()
        self._header_field = b""
        self._header_value = b""

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
        }

    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise InvalidInput(f"Too many form parts (at most {MAX_PARTS})")
        self._part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        name = self._header_field.decode("latin-1").strip().lower()
        self._part.headers[name] = self._header_value.strip()
        self._header_field = self._header_value = b""

    def on_headers_finished(self) -> None:
        part = self._part
        _, options = parse_options_header(part.headers.get("content-disposition", b""))
        part.name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        part.filename = filename.decode("utf-8", "replace") if filename is not None else None
        declared = part.headers.get("content-type")
        part.content_type = declared.decode("latin-1") if declared is not None else None
        if part.filename is not None and part.name == FILE_KEY and self.upload is None:
            self.upload = part

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        part.size += end - start
        if part is self.upload:
            self.flush_due = self.writer.add(data[start:end]) or self.flush_due
        elif part.filename is None:
            allowed = self.messages_bytes if part.name == MESSAGES_FIELD else MAX_FIELD_BYTES
            if part.size > allowed:
                raise PayloadTooLarge(
                    f"The form field {part.name!r} is larger than the {allowed} bytes allowed"
                )
            part.data.append(data[start:end])
        # other files (a second under `file`, any under another key) are counted and dropped

    def on_part_end(self) -> None:
        part = self._part
        another = part.name == FILE_KEY and part.filename is not None and part is not self.upload
        if another and (part.size or part.filename):  # an empty file input is no file
            self.extra_files += 1
        if part.filename is None:
            try:
                value = b"".join(part.data).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidInput(f"The form field {part.name!r} is not UTF-8") from exc
            self.fields.setdefault(part.name, []).append(value)


def _field(fields: dict[str, list[str]], name: str) -> object:
    """A form field's value; a repeated or array-style field is a list (not a string)."""
    values = fields.get(name, []) + fields.get(f"{name}[]", [])
    if not values:
        return MISSING
    if len(values) > 1 or f"{name}[]" in fields:
        return values
    return values[0]


async def read_form_input(
    request: Request,
    *,
    storage: Storage,
    key: str,
    max_bytes: int,
    messages_bytes: int,
    cap: int,
    idempotency_key: str | None,
) -> TriggerInput:
    """A multipart trigger call (method B); the file is stored under ``key``.

    On any error the partial upload is deleted before the error propagates.
    """
    _, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if not boundary:
        raise InvalidInput(f"{MALFORMED_FORM}: no boundary")
    writer = UploadWriter(
        storage=storage, key=key, max_bytes=max_bytes, hash_content=bool(idempotency_key)
    )
    receiver = _FormReceiver(writer, messages_bytes=messages_bytes)
    parser = MultipartParser(boundary, cast("MultipartCallbacks", receiver.callbacks()))
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes:
                raise PayloadTooLarge(TOO_LARGE.format(max_bytes))
            try:
                parser.write(chunk)
            except MultipartParseError as exc:
                raise InvalidInput(MALFORMED_FORM) from exc
            if receiver.flush_due:
                receiver.flush_due = False
                await to_thread.run_sync(writer.flush)
            if parser.state == MultipartState.END:
                break
        if parser.state != MultipartState.END:
            raise InvalidInput(f"{MALFORMED_FORM}: the body ends before its closing boundary")
        await to_thread.run_sync(writer.close if receiver.upload is not None else writer.discard)
        trigger = _trigger_from_form(
            receiver, writer, key=key, cap=cap, idempotency_key=idempotency_key
        )
    except BaseException:
        await to_thread.run_sync(writer.discard)
        raise
    if trigger.upload is None and receiver.upload is not None:
        await to_thread.run_sync(writer.discard)  # an empty file input: no file
    return trigger


def _trigger_from_form(
    receiver: _FormReceiver,
    writer: UploadWriter,
    *,
    key: str,
    cap: int,
    idempotency_key: str | None,
) -> TriggerInput:
    fields = receiver.fields
    upload: StoredUpload | None = None
    part = receiver.upload
    if part is not None and not (part.size == 0 and not part.filename):
        upload = StoredUpload.of(writer, filename=part.filename, content_type=part.content_type)
    messages: object = _field(fields, MESSAGES_FIELD)
    if isinstance(messages, str):
        try:
            messages = decode_messages_json(messages, cap=cap)
        except ValueError:
            messages = UnreadableMessages()
        if holds_lone_surrogate(messages):
            raise InvalidInput(LONE_SURROGATE)
    digest = None
    if idempotency_key:
        hashed: dict[str, object] = {"fields": fields, "file": writer.sha256 if upload else None}
        if receiver.extra_files:  # refused, never the replay of a call with one file
            hashed["extra_files"] = receiver.extra_files
        digest = body_hash(hashed)
    send_at = _field(fields, "send_at")
    return TriggerInput(
        campaign_id=_field(fields, "campaign_id"),
        send_at=None if send_at is MISSING or send_at == "" else send_at,
        messages=messages,
        upload=upload,
        idempotency_key=idempotency_key,
        body_hash=digest,
        extra_files=receiver.extra_files,
    )

"""Uploads: a message file's bytes streamed to storage in bounded memory.

:class:`UploadWriter` takes the bytes of an upload as they arrive (counting them
against the size limit, hashing them, keeping the first few KB to sniff the format)
and writes them to storage in 1 MB pieces from a worker thread, where it also notes
what the CSV reader must refuse but would not see cheaply: a NUL byte anywhere, and
an odd number of quote characters (a quoted value never closed would otherwise
swallow the rest of the file). :func:`sniff_csv` refuses what is not a CSV file.
The file is then read once by :mod:`campaign_trigger.services.ingest`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import IO, Self

from fsspec.core import url_to_fs

from campaign_trigger.errors import InvalidInput, PayloadTooLarge
from campaign_trigger.store.files import Storage

UNSUPPORTED = "Unsupported file format - only csv files are supported"
READ_ERROR = "Error when reading CSV file: {}"
TOO_LARGE = "The file is larger than the {} bytes allowed"

SNIFF_BYTES = 8192
WRITE_PIECE = 1 << 20

_BINARY_MAGIC = (
    b"%PDF",
    b"PK\x03\x04",
    b"PK\x05\x06",
    b"\x89PNG",
    b"GIF8",
    b"\xff\xd8\xff",
    b"\x1f\x8b",
    b"\xd0\xcf\x11\xe0",
    b"BZh",
    b"7z\xbc\xaf",
    b"Rar!",
    b"{\\rtf",
    b"\x7fELF",
    b"MZ",
    b"II*\x00",
    b"MM\x00*",
    b"RIFF",
    b"OggS",
    b"\x00\x00\x00",
    b"SQLite format",
)
_TEXT_SHAPES = (b"{", b"<?xml", b"<!doctype", b"<html", b"<svg", b"[{", b'["')
_CSV_CONTENT_TYPES = frozenset(
    {
        "",
        "text/csv",
        "text/plain",
        "application/csv",
        "application/x-csv",
        "text/x-csv",
        "text/comma-separated-values",
        "application/vnd.ms-excel",
        "application/octet-stream",
    }
)
_CSV_SUFFIXES = ("", ".csv", ".txt")


def sniff_csv(head: bytes, *, filename: str | None, content_type: str | None) -> None:
    """InvalidInput(UNSUPPORTED) unless name, declared type and first bytes look like CSV.

    Encoding problems of a text file are not decided here: the reader reports them.
    """
    name = (filename or "").rsplit("/", 1)[-1].lower()
    suffix = "." + name.rsplit(".", 1)[1] if "." in name else ""
    declared = (content_type or "").split(";", 1)[0].strip().lower()
    if suffix not in _CSV_SUFFIXES or declared not in _CSV_CONTENT_TYPES:
        raise InvalidInput(UNSUPPORTED)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InvalidInput(READ_ERROR.format("the file is UTF-16 encoded; use UTF-8"))
    if head.startswith(_BINARY_MAGIC) or b"\x00" in head:
        raise InvalidInput(UNSUPPORTED)
    text_start = head.removeprefix(b"\xef\xbb\xbf").lstrip().lower()
    if text_start.startswith(_TEXT_SHAPES):
        raise InvalidInput(UNSUPPORTED)
    controls = sum(1 for byte in head if byte < 9 or 13 < byte < 32)
    if head and controls * 100 > len(head):
        raise InvalidInput(UNSUPPORTED)


@dataclass(frozen=True, slots=True)
class ContentFacts:
    """What the writer saw of an upload's bytes that the CSV reader would not refuse."""

    nul_offset: int | None  # the first NUL byte's offset, if any
    quote_count: int  # quote characters in the file


@dataclass(frozen=True)
class StoredUpload:
    """A CSV upload streamed to storage under ``key``: what the create checks need."""

    key: str
    filename: str | None
    content_type: str | None
    head: bytes
    size: int
    facts: ContentFacts

    @classmethod
    def of(cls, writer: UploadWriter, *, filename: str | None, content_type: str | None) -> Self:
        return cls(
            key=writer.key,
            filename=filename,
            content_type=content_type,
            head=writer.head,
            size=writer.size,
            facts=writer.facts,
        )


class UploadWriter:
    """Receives an upload piece by piece and writes it to ``storage[key]``."""

    def __init__(
        self, *, storage: Storage, key: str, max_bytes: int, hash_content: bool = False
    ) -> None:
        self.storage = storage
        self.key = key
        self.max_bytes = max_bytes
        self.size = 0
        self.head = b""
        self._digest = hashlib.sha256() if hash_content else None
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._written = 0
        self._nul_offset: int | None = None
        self._quotes = 0
        self._file: IO[bytes] | None = None

    def add(self, data: bytes) -> bool:
        """Account for ``data``; True when a piece is ready to be written with :meth:`flush`."""
        self.size += len(data)
        if self.size > self.max_bytes:
            raise PayloadTooLarge(TOO_LARGE.format(self.max_bytes))
        if len(self.head) < SNIFF_BYTES:
            self.head += data[: SNIFF_BYTES - len(self.head)]
        if self._digest is not None:
            self._digest.update(data)
        self._pending.append(data)
        self._pending_size += len(data)
        return self._pending_size >= WRITE_PIECE

    def flush(self) -> None:
        """Write what is pending (blocking: call it from a worker thread)."""
        if self._file is None:
            self._file = self.storage.open(self.key, "wb")
        for piece in self._pending:
            self._note(piece)
        if self._pending:
            self._file.writelines(self._pending)
        self._pending.clear()
        self._pending_size = 0

    def _note(self, piece: bytes) -> None:
        if self._nul_offset is None and (at := piece.find(b"\x00")) >= 0:
            self._nul_offset = self._written + at
        self._quotes += piece.count(b'"')
        self._written += len(piece)

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """Forget the upload: close and delete whatever was written."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.storage.delete(self.key)

    @property
    def sha256(self) -> str:
        """The content's hash (empty unless built with ``hash_content=True``)."""
        return self._digest.hexdigest() if self._digest is not None else ""

    @property
    def facts(self) -> ContentFacts:
        """What was seen of the bytes written so far."""
        return ContentFacts(nul_offset=self._nul_offset, quote_count=self._quotes)


def copy_to_storage(
    source: IO[bytes], *, storage: Storage, key: str, max_bytes: int, chunk_size: int = 64 * 1024
) -> UploadWriter:
    """Stream a readable file into storage (the CLI and benchmarks; the API streams itself)."""
    writer = UploadWriter(storage=storage, key=key, max_bytes=max_bytes)
    try:
        while chunk := source.read(chunk_size):
            if writer.add(chunk):
                writer.flush()
        writer.close()
    except BaseException:
        writer.discard()
        raise
    return writer


def storage_key(storage: Storage, location: str) -> str:
    """The key of ``location`` under the storage root: a key already, or a path or URL
    inside the root; InvalidInput for anything outside it."""
    if "://" not in location and not location.startswith("/"):
        return location.lstrip("./")
    fs, path = url_to_fs(location)
    root = storage.root.rstrip("/") + "/"
    if type(fs) is not type(storage.fs) or not str(path).startswith(root):
        raise InvalidInput(READ_ERROR.format(f"{location} is not under the storage URL"))
    return str(path).removeprefix(root)


def stage_stored_file(
    *, storage: Storage, source_key: str, target: Storage, key: str, max_bytes: int
) -> StoredUpload:
    """Copy a CSV file in ``storage`` to ``target[key]`` as an upload (send-batch's file)."""
    try:
        source = storage.open(storage_key(storage, source_key), "rb")
    except (FileNotFoundError, IsADirectoryError, ValueError) as exc:
        raise InvalidInput(READ_ERROR.format(f"no file at {source_key}")) from exc
    with source:
        writer = copy_to_storage(source, storage=target, key=key, max_bytes=max_bytes)
    name = source_key.rsplit("/", 1)[-1]
    return StoredUpload.of(writer, filename=name, content_type="text/csv")

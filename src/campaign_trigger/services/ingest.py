"""Message files: streamed to storage in bounded memory, then validated in blocks.

:class:`UploadWriter` takes the bytes of an upload as they arrive (counting them
against the size limit, hashing them, keeping the first few KB to sniff the format)
and writes them to storage in 1 MB pieces. :func:`validate_message_file` then reads
the stored file back in windows of 8 MB cut at line ends, parses each with all of
pyarrow's threads (every column a string) and checks it with the campaign's pandera
model (:mod:`campaign_trigger.schemas.csv`): memory stays bounded whatever the size,
and the whole costs about one bare ``pyarrow.csv.read_csv`` of the file.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import mmap
import os
from collections.abc import Iterator, Sequence
from typing import IO

import pandas as pd
import pandera.pandas as pa
import pyarrow
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from campaign_trigger.errors import InvalidInput, PayloadTooLarge
from campaign_trigger.schemas.csv import USER_COLUMN, message_file_model
from campaign_trigger.store.files import Storage

UNSUPPORTED = "Unsupported file format - only csv files are supported"
USER_MISSING = "Invalid file : 'User' column is missing"
READ_ERROR = "Error when reading CSV file: {}"
TOO_LARGE = "The file is larger than the {} bytes allowed"

SNIFF_BYTES = 8192
WRITE_PIECE = 1 << 20
WINDOW_BYTES = 8 << 20
MAX_LINE_BYTES = 64 << 20
MAX_HEADER_BYTES = 1 << 20

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


def missing_variables_error(missing: Sequence[str]) -> InvalidInput:
    return InvalidInput(f"Invalid file : missing variables : ({', '.join(missing)})")


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
        if self._pending:
            self._file.writelines(self._pending)
        self._pending.clear()
        self._pending_size = 0

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


def _cut(view: memoryview | bytes, start: int, end: int) -> int:
    """The offset just after the last line end in ``view[start:end]``, or -1."""
    tail = bytes(view[max(start, end - MAX_LINE_BYTES) : end])
    cut = max(tail.rfind(b"\n"), tail.rfind(b"\r"))
    return -1 if cut < 0 else end - len(tail) + cut + 1


def _window_end(handle: IO[bytes], *, start: int, size: int, window_bytes: int) -> int:
    """Where the window starting at ``start`` ends: just after its last line end."""
    end = min(size, start + window_bytes)
    while end < size:
        handle.seek(max(start, end - min(window_bytes, MAX_LINE_BYTES)))
        tail = handle.read(end - handle.tell())
        cut = max(tail.rfind(b"\n"), tail.rfind(b"\r"))
        if cut >= 0:
            return end - len(tail) + cut + 1
        if end - start >= MAX_LINE_BYTES:  # a line longer than a window: widen it
            raise InvalidInput(READ_ERROR.format("a line is longer than 64 MB"))
        end = min(size, end + window_bytes)
    return end


def _mapped_windows(path: str, window_bytes: int) -> Iterator[tuple[memoryview, bool]]:
    """Windows of a local file, zero copy: each window is its own memory map, unmapped
    once nothing refers to it any more, so the process's RSS stays bounded."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        start = 0
        while start < size:
            end = _window_end(handle, start=start, size=size, window_bytes=window_bytes)
            base = start - start % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(handle.fileno(), end - base, offset=base, access=mmap.ACCESS_READ)
            quoted = mapped.find(b'"', start - base) >= 0
            yield memoryview(mapped)[start - base :], quoted
            # Readers may still hold the window; the map then goes when they let go.
            with contextlib.suppress(BufferError):
                mapped.close()
            del mapped
            start = end


def _streamed_windows(
    storage: Storage, key: str, window_bytes: int
) -> Iterator[tuple[bytes, bool]]:
    """Windows of a remote file, read piece by piece."""
    carry = b""
    with storage.open(key, "rb") as handle:
        while True:
            data = handle.read(window_bytes)
            if not data:
                if carry.strip():
                    yield carry, b'"' in carry
                return
            buffer = carry + data if carry else data
            cut = _cut(buffer, 0, len(buffer))
            if cut < 0:
                if len(buffer) > MAX_LINE_BYTES:
                    raise InvalidInput(READ_ERROR.format("a line is longer than 64 MB"))
                carry = buffer
                continue
            carry = buffer[cut:]
            yield buffer[:cut], buffer.find(b'"', 0, cut) >= 0


def _windows(
    storage: Storage, key: str, window_bytes: int
) -> Iterator[tuple[memoryview | bytes, bool]]:
    """The stored file in windows of about WINDOW_BYTES, each ending at a line end, and
    whether the window holds a quote character.

    pyarrow parses each window with all its threads: about as fast as reading the
    whole file at once, in bounded memory.
    """
    local = storage.local_path(key)
    if local is not None:
        yield from _mapped_windows(local, window_bytes)
    else:
        yield from _streamed_windows(storage, key, window_bytes)


def read_header(storage: Storage, key: str) -> list[str]:
    """The column names of the stored file's first line."""
    with storage.open(key, "rb") as handle:
        start = handle.read(MAX_HEADER_BYTES + 1)
    ends = [i for i in (start.find(b"\n"), start.find(b"\r")) if i >= 0]
    first = start[: min(ends)] if ends else start
    if not first.strip():
        raise InvalidInput(
            READ_ERROR.format("the file is empty" if not start else "the header line is empty")
        )
    if len(first) > MAX_HEADER_BYTES:
        raise InvalidInput(READ_ERROR.format("the header line is longer than 1 MB"))
    try:
        text = first.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            READ_ERROR.format(f"invalid UTF-8 in the header line ({exc.reason})")
        ) from exc
    try:
        names = next(csv.reader(io.StringIO(text), strict=True))
    except (csv.Error, StopIteration) as exc:
        raise InvalidInput(READ_ERROR.format(f"bad header line ({exc})")) from exc
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidInput(READ_ERROR.format(f"duplicate column {name!r}"))
        seen.add(name)
    return names


def _arrow_message(exc: Exception) -> str:
    text = str(exc).strip()
    return text if len(text) <= 300 else text[:297] + "..."


def _check_window(
    table: pyarrow.Table, *, model: type[pa.DataFrameModel], first_row: int, quoted: bool
) -> None:
    if quoted:  # line breaks inside values come only from a broken quote (they are refused)
        for name, column in zip(table.column_names, table.columns, strict=True):
            if pc.any(pc.match_substring(column, "\n")).as_py():
                raise InvalidInput(
                    READ_ERROR.format(
                        f"unterminated quoted value or line break inside a value in column {name!r}"
                    )
                )
    frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    frame.index = pd.RangeIndex(first_row, first_row + len(frame))
    try:
        model.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        raise _failure_message(exc.failure_cases) from None


def _failure_message(cases: pd.DataFrame) -> InvalidInput:
    """Our message for pandera's failure cases (rows counted from 1 after the header)."""
    first = cases.iloc[0]
    column, check = str(first.get("column")), str(first.get("check"))
    rows = sorted({int(i) + 1 for i in cases["index"].dropna().tolist()})
    where = f"row {rows[0]}" if rows else "the file"
    more = f" (and {len(rows) - 1} more rows)" if len(rows) > 1 else ""
    if column == USER_COLUMN and ("nullable" in check or "str_length" in check):
        return InvalidInput(f"Invalid file : empty 'User' value on {where}{more}")
    return InvalidInput(READ_ERROR.format(f"column {column!r} failed {check} on {where}{more}"))


def validate_message_file(
    *, storage: Storage, key: str, variables: Sequence[str], window_bytes: int = WINDOW_BYTES
) -> int:
    """Check a stored message file for a campaign's variables; returns its row count.

    Raises InvalidInput with the spec's messages: 'User' column missing, missing
    variables, 'Error when reading CSV file: ...' (encoding, quoting, ragged rows).
    """
    names = read_header(storage, key)
    if USER_COLUMN not in names:
        raise InvalidInput(USER_MISSING)
    missing = [v for v in variables if v not in names]
    if missing:
        raise missing_variables_error(missing)
    columns = [USER_COLUMN, *(v for v in variables if v != USER_COLUMN)]
    model = message_file_model(tuple(variables))
    options = {
        "parse_options": pcsv.ParseOptions(delimiter=",", newlines_in_values=False),
        "convert_options": pcsv.ConvertOptions(
            column_types={name: pyarrow.string() for name in names},
            include_columns=columns,
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    }
    rows = 0
    try:
        for number, (window, quoted) in enumerate(_windows(storage, key, window_bytes)):
            table = pcsv.read_csv(
                pyarrow.py_buffer(window),
                read_options=pcsv.ReadOptions(
                    column_names=names, skip_rows=1 if number == 0 else 0, use_threads=True
                ),
                **options,
            )
            _check_window(table, model=model, first_row=rows, quoted=quoted)
            rows += table.num_rows
    except (pyarrow.ArrowInvalid, UnicodeDecodeError) as exc:
        raise InvalidInput(READ_ERROR.format(_arrow_message(exc))) from None
    if rows == 0:
        raise InvalidInput("Invalid file : no messages (the file has a header and no rows)")
    return rows

"""Message files: a stored CSV upload parsed ONCE into the request's message file.

:func:`ingest_message_file` reads the upload with pyarrow's streaming CSV reader in
blocks of 512 KB (memory stays bounded whatever the size: the reader keeps a few dozen
blocks ahead), every column as text: no type inference and no null markers, so
``007``, ``2.00``, ``NA``, ``TRUE``, `` x `` and an empty cell stay exactly what the
file holds (after CSV unquoting; quoted values may hold commas, quotes and line
breaks). Every ~130,000 rows are checked with the campaign's pandera model
(:mod:`campaign_trigger.schemas.csv`) and appended to the request's message file
(:mod:`campaign_trigger.services.message_file`), which is all delivery ever reads.
Parsing runs a block ahead in a thread, overlapping the checks and the writing.
"""

from __future__ import annotations

import contextlib
import csv
import io
import queue
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import pandas as pd
import pandera.pandas as pa
import pyarrow
import pyarrow.csv as pcsv

from campaign_trigger.errors import InvalidInput
from campaign_trigger.schemas.csv import MAX_USER_ID, USER_COLUMN, message_file_model
from campaign_trigger.services.message_file import USER_FIELD, MessageFileWriter
from campaign_trigger.services.trigger_input import missing_variables_error
from campaign_trigger.services.uploads import READ_ERROR, ContentFacts
from campaign_trigger.store.files import Storage

T = TypeVar("T")

USER_MISSING = "Invalid file : 'User' column is missing"
NO_ROWS = "Invalid file : no messages (the file has a header and no rows)"
# The streaming reader keeps ~36 blocks read ahead, and parsing runs a table ahead of the
# checks: 512 KB blocks and tables of 131,072 rows hold ~40 MB of Arrow memory, half of
# what 1 MB and 262,144 did, for ~8 % more time (a pandera call has a fixed cost).
BLOCK_BYTES = 1 << 19
CHECK_ROWS = 1 << 17
MAX_HEADER_BYTES = 1 << 20


class _NoBlockEndsInCR(io.RawIOBase):
    """``raw`` as read by pyarrow's CSV reader, no read but the last ending in ``\r``.

    Each read is a block of the reader, and pyarrow (26.0.1) read a quoted value's
    ``\r\n`` as ``\r`` when the ``\r`` was a block's last byte: the message went
    without its line break, and nothing said so. Such a ``\r`` is held for the next read.
    """

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self._raw = raw
        self._held = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        while True:
            want = -1 if size is None or size < 0 else max(size - len(self._held), 1)
            block: bytes = self._raw.read(want)
            data, self._held = self._held + block, b""
            if not block:  # the end: what was held
                return data
            if data.endswith(b"\r"):
                data, self._held = data[:-1], b"\r"
            if data:
                return data


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


_QUOTED_ROW = re.compile(r"(Expected \d+ columns, got \d+):.*", re.DOTALL)
_QUOTED_VALUE = re.compile(r"(invalid value) .*", re.DOTALL)


def _arrow_message(exc: Exception) -> str:
    """pyarrow's reason, without the row or value it quotes: the message is also the
    Prefect UI's (a refused send-batch run's state, artifact and log), where a user id
    or a one-time code must not be read. The row's number stays."""
    text = _QUOTED_VALUE.sub(r"\1", _QUOTED_ROW.sub(r"\1", str(exc).strip()))
    return text if len(text) <= 300 else text[:297] + "..."


def _check_content(facts: ContentFacts) -> None:
    """What the reader would accept but must not: NUL bytes, a quote never closed."""
    if facts.nul_offset is not None:
        raise InvalidInput(
            READ_ERROR.format(f"a NUL byte (\\x00) at byte {facts.nul_offset} of the file")
        )
    if facts.quote_count % 2:
        raise InvalidInput(
            READ_ERROR.format(
                "unbalanced quotes: a quoted value is not closed, or an unquoted value holds "
                'a quote (quote such values and double their quotes: "say ""hi""")'
            )
        )


def _check_block(table: pyarrow.Table, *, model: type[pa.DataFrameModel], first_row: int) -> None:
    frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    frame.index = pd.RangeIndex(first_row, first_row + len(frame))
    try:
        model.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        raise _failure_message(exc.failure_cases) from None


def _failure_message(cases: pd.DataFrame) -> InvalidInput:
    """Our message for pandera's failure cases. Rows are numbered as pyarrow's parse
    errors number them (``Row #3: Expected 2 columns``) and as a spreadsheet shows the
    file: the header is row 1 (blank lines are not counted), so a row has one number
    whichever check refuses it."""
    first = cases.iloc[0]
    column, check = str(first.get("column")), str(first.get("check"))
    rows = sorted({int(i) + 2 for i in cases["index"].dropna().tolist()})
    where = f"row {rows[0]}" if rows else "the file"
    more = f" (and {len(rows) - 1} more rows)" if len(rows) > 1 else ""
    if column == USER_COLUMN:
        value = first.get("failure_case")
        if isinstance(value, str) and len(value) > MAX_USER_ID:
            return InvalidInput(
                f"Invalid file : 'User' value longer than {MAX_USER_ID} characters on {where}{more}"
            )
        return InvalidInput(f"Invalid file : empty 'User' value on {where}{more}")
    return InvalidInput(READ_ERROR.format(f"column {column!r} failed {check} on {where}{more}"))


def _message_table(table: pyarrow.Table, variables: Sequence[str]) -> pyarrow.Table:
    """A block as message-file columns: the users under USER_FIELD, then each variable."""
    columns = {USER_FIELD: table.column(USER_COLUMN)}
    columns.update({name: table.column(name) for name in variables})
    return pyarrow.table(columns)


def _row_groups(reader: Iterable[pyarrow.RecordBatch], *, rows: int) -> Iterator[pyarrow.Table]:
    """The reader's batches as tables of at least ``rows`` rows (the last one fewer)."""
    batches: list[pyarrow.RecordBatch] = []
    pending = 0
    for batch in reader:
        batches.append(batch)
        pending += batch.num_rows
        if pending >= rows:
            yield pyarrow.Table.from_batches(batches)
            batches, pending = [], 0
    if batches:
        yield pyarrow.Table.from_batches(batches)


_DONE = object()


def _read_ahead(items: Iterator[T], *, depth: int = 2) -> Iterator[T]:
    """``items``, produced by a thread up to ``depth`` ahead of the consumer."""
    ready: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put(_DONE)
        except BaseException as exc:  # handed to the consumer
            ready.put(exc)

    thread = threading.Thread(target=produce, name="csv-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                ready.get_nowait()
        thread.join()


def ingest_message_file(
    *,
    storage: Storage,
    upload_key: str,
    facts: ContentFacts,
    messages_key: str,
    variables: Sequence[str],
    chunk_size: int,
    block_bytes: int = BLOCK_BYTES,
) -> int:
    """Check a stored CSV upload and write the request's message file; returns its rows.

    Raises InvalidInput with the spec's messages: 'User' column missing, missing
    variables, 'Error when reading CSV file: ...' (encoding, quoting, ragged rows,
    disallowed characters), an empty or too long 'User' value. Nothing is left in
    storage under ``messages_key`` when it raises.
    """
    names = read_header(storage, upload_key)
    if USER_COLUMN not in names:
        raise InvalidInput(USER_MISSING)
    missing = [v for v in variables if v not in names]
    if missing:
        raise missing_variables_error(missing)
    _check_content(facts)
    model = message_file_model(tuple(variables))
    convert = pcsv.ConvertOptions(
        column_types={name: pyarrow.string() for name in names},
        include_columns=list(dict.fromkeys([USER_COLUMN, *variables])),
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )
    options = {
        # The header as read_header decoded it (a BOM dropped); blocks need not hold it.
        "read_options": pcsv.ReadOptions(
            block_size=block_bytes, use_threads=False, column_names=names, skip_rows=1
        ),
        "parse_options": pcsv.ParseOptions(delimiter=",", newlines_in_values=True),
        "convert_options": convert,
    }
    writer = MessageFileWriter(
        storage=storage, key=messages_key, variables=variables, chunk_size=chunk_size
    )
    rows = 0
    local = storage.local_path(upload_key)
    try:
        with contextlib.ExitStack() as stack:
            # Not memory-mapped: a mapped file's pages would count in our RSS.
            source = _NoBlockEndsInCR(
                pyarrow.OSFile(local, "r")
                if local is not None
                else stack.enter_context(storage.open(upload_key, "rb"))
            )
            groups = _row_groups(pcsv.open_csv(source, **options), rows=CHECK_ROWS)
            for table in _read_ahead(groups):  # parsing overlaps checking and writing
                _check_block(table, model=model, first_row=rows)
                writer.write(_message_table(table, variables))
                rows += table.num_rows
        if rows == 0:
            raise InvalidInput(NO_ROWS)
        writer.close()
    except (pyarrow.ArrowInvalid, UnicodeDecodeError) as exc:
        writer.discard()
        raise InvalidInput(READ_ERROR.format(_arrow_message(exc))) from None
    except BaseException:
        writer.discard()
        raise
    return rows

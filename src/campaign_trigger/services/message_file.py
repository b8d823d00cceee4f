"""A request's message file: its messages once parsed, every value as text, in Arrow IPC.

Written once, when the request is created (the CSV ingest, or the JSON messages), and
read chunk by chunk at delivery: record batch ``k`` of the file is chunk ``k``, of the
request's ``chunk_size`` rows (the last one shorter). Nobody parses the caller's CSV
again, so what is delivered is what was validated, byte for byte.

Columns: :data:`USER_FIELD` (the user ids; a name no template variable can have) and
one column per template variable of the campaign, all non-null UTF-8 strings.
A delivery worker maps the file (or, for remote storage, reads one batch's bytes):
its memory holds one chunk, whatever the request's size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, Final

import pyarrow as pa
import pyarrow.ipc as ipc

from campaign_trigger.store.files import Storage

USER_FIELD: Final = "@user"


def _use_jemalloc() -> None:
    """Arrow's jemalloc pool where the build has it (the Linux wheels do): under a 200 MB
    CSV upload the API peaked at 370 MB with it, 392-402 MB with the default mimalloc
    pool, which keeps more of what the ingest freed (test_api_upload_limits)."""
    with contextlib.suppress(NotImplementedError):
        pa.set_memory_pool(pa.jemalloc_memory_pool())


_use_jemalloc()


def file_schema(variables: Sequence[str]) -> pa.Schema:
    """The file's columns: the users, then each variable, all non-null strings."""
    names = [USER_FIELD, *dict.fromkeys(variables)]
    return pa.schema([pa.field(name, pa.string(), nullable=False) for name in names])


class MessageFileWriter:
    """Writes tables of messages as record batches of exactly ``chunk_size`` rows."""

    def __init__(
        self, *, storage: Storage, key: str, variables: Sequence[str], chunk_size: int
    ) -> None:
        self.storage = storage
        self.key = key
        self.schema = file_schema(variables)
        self.chunk_size = chunk_size
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._handle: IO[Any] | None = None
        self._writer: ipc.RecordBatchFileWriter | None = None

    def write(self, table: pa.Table) -> None:
        """Append messages (columns named as :func:`file_schema`; extra columns dropped)."""
        table = table.select(self.schema.names).cast(self.schema)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.chunk_size:
            self._write_full_chunks()

    def _write_full_chunks(self) -> None:
        merged = pa.concat_tables(self._pending)
        full = (merged.num_rows // self.chunk_size) * self.chunk_size
        for start in range(0, full, self.chunk_size):
            self._write_batch(merged.slice(start, self.chunk_size))
        rest = merged.slice(full)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def _write_batch(self, table: pa.Table) -> None:
        if self._writer is None:
            self._handle = self.storage.open(self.key, "wb")
            self._writer = ipc.new_file(self._handle, self.schema)
        # One batch per chunk: combined columns have one piece each.
        self._writer.write_table(table.combine_chunks(), max_chunksize=self.chunk_size)
        self.rows += table.num_rows

    def close(self) -> int:
        """Write what is left and close the file; returns the number of messages."""
        if self._pending_rows:
            self._write_batch(pa.concat_tables(self._pending))
            self._pending, self._pending_rows = [], 0
        if self._writer is None:  # no message at all: an empty file still has a schema
            self._handle = self.storage.open(self.key, "wb")
            self._writer = ipc.new_file(self._handle, self.schema)
        self._writer.close()
        assert self._handle is not None
        self._handle.close()
        self._writer = self._handle = None
        return self.rows

    def discard(self) -> None:
        """Forget the file: close and delete whatever was written."""
        if self._writer is not None:
            self._writer.close()
        if self._handle is not None:
            self._handle.close()
        self._writer = self._handle = None
        self.storage.delete(self.key)


def write_messages(
    *,
    storage: Storage,
    key: str,
    users: Sequence[str],
    values: Mapping[str, Sequence[str]],
    chunk_size: int,
) -> int:
    """Write a whole (small) request's messages: user ids and each variable's texts."""
    writer = MessageFileWriter(
        storage=storage, key=key, variables=list(values), chunk_size=chunk_size
    )
    columns = {USER_FIELD: pa.array(users, pa.string())}
    columns.update({name: pa.array(texts, pa.string()) for name, texts in values.items()})
    try:
        writer.write(pa.table(columns))
        return writer.close()
    except BaseException:
        writer.discard()
        raise


def read_chunk(*, storage: Storage, key: str, chunk_no: int) -> pa.Table:
    """Chunk ``chunk_no`` of the request (memory-mapped when storage is local)."""
    local = storage.local_path(key)
    if local is not None:  # zero copy: the batch's buffers keep the mapping alive
        batch = ipc.open_file(pa.memory_map(local, "r")).get_batch(chunk_no)
        return pa.Table.from_batches([batch])
    with storage.open(key, "rb") as handle:
        batch = ipc.open_file(handle).get_batch(chunk_no)
        # Copy out of the file's buffers before the handle closes.
        return pa.Table.from_batches([batch]).combine_chunks()


def iter_chunks(*, storage: Storage, key: str) -> Iterator[pa.Table]:
    """Every chunk in order, each read then let go: for one pass over a whole file (a
    preview). Not memory-mapped: the pages of a mapped file read once would stay in the
    process's RSS."""
    with storage.open(key, "rb") as handle:
        reader = ipc.open_file(handle)
        for chunk_no in range(reader.num_record_batches):
            yield pa.Table.from_batches([reader.get_batch(chunk_no)])

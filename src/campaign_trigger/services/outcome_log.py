"""The outcome log: a chunk's report rows, recorded as the provider answers.

Every report row is keyed by (request, app, message row, device): at most one row
each (a unique constraint). :class:`OutcomeRecorder` writes rows in small batches —
whatever arrived while the previous batch was being written, and for a batch of fewer
than 64 rows what arrives in the next 2 ms, so a batch is a few hundred rows at full
speed and one row when answers trickle in — and
:meth:`OutcomeRecorder.record` returns only once its row is committed. The push
sender holds a message's concurrency slot until then, so after a crash at most
``delivery_concurrency`` messages were sent and not recorded; a re-run skips every
recorded (app, row, device) (:func:`recorded_targets`) and sends the rest.

The last batch of a chunk also writes its ``DeliveredChunk`` row: a chunk with one is
complete and never looked at again. In-app chunks have no outside effect to race
with: their outcome rows, inbox rows and ``DeliveredChunk`` row go in one
transaction (:func:`record_whole_chunk`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import Insert, Table, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from campaign_trigger.config import get_settings
from campaign_trigger.delivery import freeze
from campaign_trigger.services.inbox import InboxEntry, publish_inapp
from campaign_trigger.store.db import in_thread
from campaign_trigger.store.models import DeliveredChunk, Outcome

_CHUNKS: Final[Table] = DeliveredChunk.__table__  # type: ignore[attr-defined]
MAX_BATCH: Final = 2000
MIN_BATCH: Final = 64
LINGER_SECONDS: Final = 0.002

OutcomeRow = tuple[str, int, str, str, str, str, datetime | None, str]
"""A report row as it is inserted: request id, message row, app id, user id, device id,
channel (its stored value), ``sent_at`` (UTC) or None, error message."""

_INSERT: Final = (
    "INSERT INTO outcome (request_id, row_no, app_id, user_id, device_id, channel, sent_at, "
    "error_message) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


@dataclass(frozen=True, slots=True)
class RecordedTargets:
    """What a chunk already has in the log (from an earlier, interrupted run)."""

    targets: frozenset[tuple[str, int, str]]  # (app id, row, device id)
    rows_without_device: frozenset[int]  # rows recorded as "No device for user"

    def has(self, app_id: str, row: int, device_id: str) -> bool:
        return (app_id, row, device_id) in self.targets or row in self.rows_without_device


def recorded_chunks(*, session: Session, request_id: str) -> set[int]:
    """The request's complete chunks."""
    rows = session.execute(
        select(col(DeliveredChunk.chunk_no)).where(col(DeliveredChunk.request_id) == request_id)
    ).all()
    return {row[0] for row in rows}


def recorded_chunk_count(*, session: Session, request_id: str) -> int:
    """How many of the request's chunks are complete (a count on the key's index)."""
    count = session.execute(
        select(func.count()).where(col(DeliveredChunk.request_id) == request_id)
    ).scalar_one()
    return int(count)


def chunk_recorded(*, session: Session, request_id: str, chunk_no: int) -> bool:
    """Whether the chunk is complete (one key lookup)."""
    found = session.execute(
        select(col(DeliveredChunk.chunk_no)).where(
            col(DeliveredChunk.request_id) == request_id,
            col(DeliveredChunk.chunk_no) == chunk_no,
        )
    ).first()
    return found is not None


def recorded_targets(
    *,
    session: Session,
    request_id: str,
    app_ids: Sequence[str],
    first_row: int,
    end_row: int,
) -> RecordedTargets:
    """The targets of rows ``[first_row, end_row)`` already in the log, under the apps
    ``app_ids`` (the campaign's apps: those the chunk's targets are made for).

    The apps make it a search of the unique index (request, app, row, device) for the
    chunk's rows alone: without them the database walked every row the request had
    recorded so far for each chunk, quadratic in the request's size.
    """
    rows = session.execute(
        select(col(Outcome.app_id), col(Outcome.row_no), col(Outcome.device_id)).where(
            col(Outcome.request_id) == request_id,
            col(Outcome.app_id).in_(app_ids),
            col(Outcome.row_no) >= first_row,
            col(Outcome.row_no) < end_row,
        )
    ).all()
    return RecordedTargets(
        targets=frozenset((app, row, device) for app, row, device in rows),
        rows_without_device=frozenset(row for _, row, device in rows if device == ""),
    )


def _insert_new(session: Session, table: Table) -> Insert:
    """INSERT that skips rows already there (a chunk raced by two runs)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def _sqlite_time(moment: datetime | None) -> str | None:
    """``UTCDateTime``'s stored form on SQLite: naive UTC text, microseconds always."""
    if moment is None:
        return None
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def _insert_outcomes(session: Session, rows: Sequence[OutcomeRow]) -> None:
    """Insert ``rows``, skipping those already there (a chunk raced by two runs).

    One ``executemany`` of tuples in their stored forms on the DB-API cursor: through
    SQLAlchemy's insert, binding a dict per row with its enum and UTC conversions cost
    twice the database's own work (docs/benchmarks.md, "A million in a minute").
    """
    connection = session.connection()
    dialect = connection.dialect
    stored: list[tuple[object, ...]] = list(rows)
    if dialect.name == "sqlite":
        stored = [(r, n, a, u, d, c, _sqlite_time(t), e) for r, n, a, u, d, c, t, e in rows]
    sql = _INSERT if dialect.paramstyle == "qmark" else _INSERT.replace("?", "%s")
    connection.exec_driver_sql(sql, stored)


Write = Callable[[Session], object]


@functools.cache
def _idle_limit_ms(dead_after: int) -> int:
    return int(freeze.worker_threshold_seconds(dead_after) * 1000)


def _locks_end_with_a_freeze(session: Session) -> None:
    """On PostgreSQL, once a transaction's rows are written: the server ends it (and its
    locks on those rows) if the process freezes before its commit for as long as makes a
    worker exit as it resumes (``delivery/freeze.py``), so the worker that takes the
    chunk over waits on them no longer than that, even for a process that never resumes.

    Set after the writes, not before: after an ``executemany`` (psycopg's pipeline) the
    server does not start the idle timer until the next statement. A process frozen in
    the middle of writing the rows keeps their locks until it resumes and exits, as on
    SQLite, where the one write lock is held until then whatever the moment."""
    if session.get_bind().dialect.name == "postgresql":
        limit = _idle_limit_ms(get_settings().dead_run_after_seconds)
        session.connection().exec_driver_sql(
            f"SET LOCAL idle_in_transaction_session_timeout = {limit}"
        )


def _commit(
    session: Session,
    rows: Sequence[OutcomeRow],
    *,
    chunk: tuple[str, int] | None = None,
    also: Sequence[Write] = (),
) -> None:
    """One transaction: outcome rows, other writes of the same answers, the chunk's mark."""
    try:
        if rows:
            _insert_outcomes(session, rows)
        for write in also:
            write(session)
        if chunk is not None:
            session.connection().execute(
                _insert_new(session, _CHUNKS),
                [{"request_id": chunk[0], "chunk_no": chunk[1], "recorded_at": datetime.now(UTC)}],
            )
        _locks_end_with_a_freeze(session)
        session.commit()
    except BaseException:
        session.rollback()
        raise


def record_whole_chunk(
    *,
    session: Session,
    request_id: str,
    chunk_no: int,
    rows: Sequence[OutcomeRow],
    inbox: Sequence[InboxEntry],
    published_at: datetime,
    ttl_seconds: int | None = None,
) -> bool:
    """Outcomes, inbox rows and the chunk's mark in one transaction; False if recorded."""
    try:
        session.execute(
            insert(DeliveredChunk).values(
                request_id=request_id, chunk_no=chunk_no, recorded_at=datetime.now(UTC)
            )
        )
        if rows:
            _insert_outcomes(session, rows)
        if inbox:
            publish_inapp(
                session=session, rows=inbox, published_at=published_at, ttl_seconds=ttl_seconds
            )
        _locks_end_with_a_freeze(session)
        session.commit()
    except IntegrityError:
        session.rollback()
        return False
    return True


class OutcomeRecorder:
    """Records one chunk's rows in batches; :meth:`record` returns once committed.

    Every write of the chunk goes through its one session, one batch after the other
    (in a worker thread): the rows, and what the answers taught about devices and apps
    (:meth:`also`), in the transaction of the batch they arrived with.
    """

    def __init__(self, *, session: Session, request_id: str, chunk_no: int) -> None:
        self.session = session
        self.request_id = request_id
        self.chunk_no = chunk_no
        self.recorded = 0
        self._also: list[Write] = []
        self._pending: list[tuple[OutcomeRow, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False

    async def record(self, row: OutcomeRow) -> None:
        """Queue ``row`` and wait until it is committed (raises if the write failed)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((row, done))
        self._wake.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        await done

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if len(self._pending) < MIN_BATCH and not self._closing:
                # more answers are on their way: one commit for them all (each commit
                # costs ~70 µs of CPU, a row ~2 µs), for at most 2 ms more per message
                await asyncio.sleep(LINGER_SECONDS)
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                await self._commit(batch)
            if self._closing:
                return

    def also(self, write: Write) -> None:
        """Commit ``write(session)`` with the next batch (e.g. a device's token gone)."""
        self._also.append(write)

    async def _commit(self, batch: list[tuple[OutcomeRow, asyncio.Future[None]]]) -> None:
        also, self._also = self._also, []
        try:
            await in_thread(_commit, self.session, [row for row, _ in batch], also=also)
        except Exception as exc:
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            return
        self.recorded += len(batch)
        for _, done in batch:
            if not done.done():
                done.set_result(None)

    async def record_all(self, rows: Sequence[OutcomeRow]) -> None:
        """Commit ``rows`` at once (outcomes known before any send)."""
        if rows:
            await in_thread(_commit, self.session, rows)
            self.recorded += len(rows)

    async def finish(self) -> None:
        """Write what is left, then mark the chunk complete."""
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            await self._writer
        also, self._also = self._also, []
        await in_thread(
            _commit, self.session, [], chunk=(self.request_id, self.chunk_no), also=also
        )

    async def abandon(self) -> None:
        """Stop writing (the chunk failed or was cancelled); committed rows stay."""
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)

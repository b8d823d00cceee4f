"""Engine and sessions. SQLite (WAL, busy timeout) by default; PostgreSQL by URL.

A SQLite database file is created 0600 in a 0700 folder (it holds SDK and identity
keys); an existing one of ours loses any group or other rights.

A database error names no value of its statement: its parameters are hidden
(``hide_parameters``), and a PostgreSQL error's detail (``Key (token)=(...)``, ``Failing
row contains (...)``) is dropped, as its text reaches logs, tracebacks and the Prefect
UI's state messages, where a rendered message (a one-time code), a user id or a push
token must never be read.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlmodel import Session

from campaign_trigger.config import get_settings
from campaign_trigger.services import json_text
from campaign_trigger.store.private import private_file

P = ParamSpec("P")
T = TypeVar("T")

SQLITE_POOL_SIZE = 40  # anyio's default thread limiter: the API's worker threads
SQLITE_POOL_OVERFLOW = 20  # asyncio's default executor (lifecycle, the outbox drainer), exits


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _without_detail(context: ExceptionContext) -> None:
    """Drop a PostgreSQL error's detail, which quotes the values of the row it failed on,
    from the driver's exception and SQLAlchemy's (kept, for code, in ``diag``)."""
    orig = context.original_exception
    diag = getattr(orig, "diag", None)
    if diag is None or not diag.message_detail or not diag.message_primary:
        return
    orig.args = (diag.message_primary,)
    wrapped = context.sqlalchemy_exception
    if wrapped is not None:
        kind = type(orig)
        wrapped.args = (f"({kind.__module__}.{kind.__name__}) {diag.message_primary}",)


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    """One engine per database URL, per process."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:" and not database.startswith("file:"):
            # 0600 before SQLite opens it: its -wal and -shm files take the same mode
            private_file(Path(database))
        # No pre-ping (a file does not drop connections); as many connections as the API
        # has worker threads, so that a thread never waits for a connection.
        engine = create_engine(
            url,
            json_serializer=json_text.dumps,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=SQLITE_POOL_SIZE,
            max_overflow=SQLITE_POOL_OVERFLOW,
            hide_parameters=True,
        )
        event.listen(engine, "connect", _on_sqlite_connect)
        return engine
    engine = create_engine(
        url,
        json_serializer=json_text.dumps,  # numbers as a JSON body wrote them
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        hide_parameters=True,
        # PostgreSQL answers a timestamptz in the session's time zone, the server's
        # unless named: east of UTC, a send time late on 9999-12-31 read as year 10000,
        # which psycopg refuses (its request's cancel, its campaign's scheduled list and
        # the outbox drainer failed on it). In UTC every stored time reads back.
        connect_args={"options": "-c timezone=UTC"},
    )
    event.listen(engine, "handle_error", _without_detail)
    return engine


def get_engine() -> Engine:
    """The engine of the configured database."""
    return engine_for(get_settings().database_url)


Sessions = Callable[[], AbstractContextManager[Session]]
"""Where a long-running use case (a loop) gets a session per unit of work: the edge that
starts it hands it :func:`session_scope` (or a test's own)."""


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session committed on success and rolled back on error.

    Opened at the edges only (the API's session dependency, the Prefect tasks, the CLI
    and the worker process); services are handed a session.
    """
    with Session(get_engine(), expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


async def in_thread(call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``asyncio.to_thread`` for work on a session the caller goes on using: cancelled, it
    raises only once the thread's call has ended.

    A cancelled ``to_thread`` raises at once while its thread goes on. The caller's
    rollback and close (:func:`session_scope`) then run beside the thread's statements and
    commit: a session is one thread's at a time, and a transaction begun by the thread
    after the rollback could stay open on a connection back in the pool, unknown to any
    session (on SQLite the one write lock, every other writer failing with "database is
    locked"; on PostgreSQL the locks of its rows).
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    done = loop.run_in_executor(None, partial(context.run, call, *args, **kwargs))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        while not done.done():  # a second cancel does not cut the wait short
            with suppress(asyncio.CancelledError):
                await asyncio.wait([done])
        if not done.cancelled():
            done.exception()  # retrieved: the cancel is what the caller gets
        raise

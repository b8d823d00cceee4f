"""The outcome log writes report rows in the forms the models store and read back, on
SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, select

from campaign_trigger.config import Settings
from campaign_trigger.services import outcome_log
from campaign_trigger.services.requests import create_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.files import Storage
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import Channel, Outcome
from service_support import Org


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of each kind (PostgreSQL skips loudly when none answers)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'outcomes.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    upgrade(url)
    return url


def _request(session: Session, settings: Settings, storage: Storage, org: Org) -> str:
    messages = [{"user_id": "u", "template_variables": {"first_name": "N", "code": "C"}}]
    return create_request(
        session=session,
        settings=settings,
        storage=storage,
        org_id=org.org_id,
        request_id=f"r-{org.org_id}",
        trigger=TriggerInput(campaign_id=org.campaign_id, messages=messages),
    )


def test_rows_are_stored_as_the_orm_stores_them_and_recorded_once(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    request_id = _request(session, settings, storage, org)
    # not UTC, and no microseconds: both have a stored form of their own to get right
    moment = datetime(2026, 11, 25, 15, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    for device, sent_at in (("orm", moment), ("orm-failed", None)):
        session.add(
            Outcome(
                request_id=request_id,
                row_no=0,
                app_id=org.app_id,
                user_id="u",
                device_id=device,
                channel=Channel.push,
                sent_at=sent_at,
                error_message="" if sent_at else "FPErrPushFailed",
            )
        )
    session.commit()
    rows: list[outcome_log.OutcomeRow] = [
        (request_id, 0, org.app_id, "u", "log", "push", moment, ""),
        (request_id, 0, org.app_id, "u", "log-failed", "push", None, "FPErrPushFailed"),
    ]
    recorder = outcome_log.OutcomeRecorder(session=session, request_id=request_id, chunk_no=0)
    asyncio.run(recorder.record_all(rows))
    asyncio.run(recorder.record_all(rows[:1]))  # a raced chunk: skipped, not an error

    raw = {
        device: tuple(row)
        for device, *row in session.connection()
        .exec_driver_sql("SELECT device_id, channel, sent_at, error_message FROM outcome")
        .all()
    }
    assert len(raw) == 4
    assert raw["log"] == raw["orm"]
    assert raw["log-failed"] == raw["orm-failed"]
    read = {o.device_id: o.sent_at for o in session.exec(select(Outcome)).all()}
    assert read["log"] == moment
    assert read["log"].tzinfo == UTC
    assert read["log-failed"] is None


def test_a_chunk_looks_up_its_own_rows_of_the_log_not_the_whole_request(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    # A gigabyte's chunk 1,500 walked the 7.5 M rows recorded before it, each chunk
    # more than the last: the search must be bounded by the chunk's rows in the index.
    request_id = _request(session, settings, storage, org)
    moment = datetime(2026, 11, 25, tzinfo=UTC)
    rows: list[outcome_log.OutcomeRow] = [
        (request_id, n, org.app_id, f"u{n}", f"d{n}", "push", moment, "") for n in range(3_000)
    ]
    asyncio.run(
        outcome_log.OutcomeRecorder(session=session, request_id=request_id, chunk_no=0).record_all(
            rows
        )
    )
    statements: list[tuple[str, Any]] = []

    def seen(
        _conn: object, _cursor: object, statement: str, parameters: object, *_: object
    ) -> None:
        statements.append((statement, parameters))

    connection = session.connection()
    event.listen(connection, "before_cursor_execute", seen)
    found = outcome_log.recorded_targets(
        session=session, request_id=request_id, app_ids=[org.app_id], first_row=2_990, end_row=3_000
    )
    event.remove(connection, "before_cursor_execute", seen)
    assert found.targets == {(org.app_id, n, f"d{n}") for n in range(2_990, 3_000)}
    assert not outcome_log.recorded_targets(
        session=session, request_id=request_id, app_ids=["other"], first_row=0, end_row=3_000
    ).targets

    ((statement, parameters),) = statements
    if connection.dialect.name == "sqlite":
        plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
        assert "row_no>? AND row_no<?" in " ".join(str(step[-1]) for step in plan), plan
    else:
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")  # as on a large table
        plan = connection.exec_driver_sql(f"EXPLAIN {statement}", parameters).all()
        # request and app equal, so the row range bounds the index scan
        conditions = " ".join(line for (line,) in plan if "Index Cond" in line)
        assert "request_id =" in conditions, plan
        assert "app_id =" in conditions, plan
        assert "row_no >=" in conditions, plan


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
def test_on_postgresql_the_rows_of_a_writer_frozen_before_its_commit_are_freed(
    session: Session, settings: Settings, storage: Storage, org: Org, database: str
) -> None:
    """A worker frozen between a batch's rows and its commit holds their locks; the worker
    that takes the chunk over writes the same rows and waits on them. The server ends the
    frozen transaction once it has been idle for the freeze a worker exits after (17.5 s with
    the tests' CT_DEAD_RUN_AFTER_SECONDS): the taker's write goes through, the frozen
    one's commit fails, and each row is stored once."""
    request_id = _request(session, settings, storage, org)
    moment = datetime(2026, 11, 27, tzinfo=UTC)
    rows: list[outcome_log.OutcomeRow] = [
        (request_id, n, org.app_id, f"u{n}", f"d{n}", "push", moment, "") for n in range(50)
    ]
    outcome_log._insert_outcomes(session, rows)
    outcome_log._locks_end_with_a_freeze(session)  # ... and frozen before the commit

    def take_over() -> None:
        with Session(engine_for(database)) as taker:
            recorder = outcome_log.OutcomeRecorder(session=taker, request_id=request_id, chunk_no=0)
            asyncio.run(recorder.record_all(rows))

    taker = threading.Thread(target=take_over, daemon=True)
    taker.start()
    taker.join(timeout=60)
    assert not taker.is_alive(), "the taker still waits on the frozen writer's rows"
    with pytest.raises(DBAPIError, match="idle-in-transaction"):  # ended by the server
        session.commit()
    session.rollback()
    with Session(engine_for(database)) as reader:
        stored = reader.exec(select(Outcome).where(Outcome.request_id == request_id)).all()
    assert sorted(o.row_no for o in stored) == list(range(50))

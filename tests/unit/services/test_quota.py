"""The request quota: periods, and exact counting under concurrency (SQLite, PostgreSQL)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import Session

from campaign_trigger.errors import QuotaExceeded
from campaign_trigger.services.quota import consume, period_bounds, remaining
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import Organisation, QuotaUsage


def test_monthly_period_ends_on_the_first_of_next_month() -> None:
    assert period_bounds("monthly", datetime(2026, 11, 22, 5, tzinfo=UTC)) == (
        "2026-11",
        datetime(2026, 12, 1, tzinfo=UTC),
    )
    assert period_bounds("monthly", datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == (
        "2026-12",
        datetime(2027, 1, 1, tzinfo=UTC),
    )


def test_daily_period_ends_at_midnight_utc() -> None:
    assert period_bounds("daily", datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == (
        "2026-12-31",
        datetime(2027, 1, 1, tzinfo=UTC),
    )


def _org(url: str, quota: int) -> int:
    with Session(engine_for(url)) as session:
        org = Organisation(name=f"quota-{quota}-{id(session)}", request_quota=quota)
        session.add(org)
        session.commit()
        assert org.id is not None
        return org.id


def _hammer(url: str, org_id: int, calls: int) -> tuple[int, int]:
    """``calls`` concurrent consumers; returns (granted, refused)."""
    granted: list[int] = []
    refused: list[int] = []
    barrier = threading.Barrier(calls)

    def one() -> None:
        barrier.wait()
        with Session(engine_for(url)) as session:
            try:
                state = consume(session=session, org_id=org_id)
                session.commit()
                granted.append(state.remaining)
            except QuotaExceeded:
                session.rollback()
                refused.append(0)

    threads = [threading.Thread(target=one) for _ in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(granted) == list(range(len(granted)))  # each unit given exactly once
    return len(granted), len(refused)


def _check_exact(url: str) -> None:
    upgrade(url)
    org_id = _org(url, quota=25)
    assert _hammer(url, org_id, calls=40) == (25, 15)
    with Session(engine_for(url)) as session:
        period, _ = period_bounds("monthly", datetime.now(UTC))
        usage = session.get(QuotaUsage, (org_id, period))
        assert usage is not None
        assert usage.used == 25
        assert remaining(session=session, org_id=org_id) == 0


def test_counting_is_exact_under_concurrency_on_sqlite(tmp_path: Path) -> None:
    _check_exact(f"sqlite:///{tmp_path / 'quota.db'}")


@pytest.mark.postgres
def test_counting_is_exact_under_concurrency_on_postgresql(postgres_url: str) -> None:
    _check_exact(postgres_url)


def test_refusal_says_when_to_retry(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    upgrade(url)
    org_id = _org(url, quota=1)
    now = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    with Session(engine_for(url)) as session:
        assert consume(session=session, org_id=org_id, now=now).remaining == 0
        with pytest.raises(QuotaExceeded) as caught:
            consume(session=session, org_id=org_id, now=now)
        assert caught.value.retry_after_seconds == 3600
        # a new period starts afresh
        december = datetime(2026, 12, 1, 0, 1, tzinfo=UTC)
        assert consume(session=session, org_id=org_id, now=december).remaining == 0

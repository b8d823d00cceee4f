"""The API-trigger request quota: one unit per create, cancel, list or report call.

Counting is atomic under concurrency on SQLite and PostgreSQL: the period's row is
created with an insert that ignores conflicts, then one conditional
``UPDATE ... SET used = used + 1 WHERE used < quota RETURNING used`` takes a unit or
takes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col

from campaign_trigger.errors import QuotaExceeded
from campaign_trigger.store.models import Organisation, QuotaUsage

QUOTA_SPENT = "The API Trigger request quota is spent for this period"


@dataclass(frozen=True)
class QuotaState:
    limit: int
    remaining: int
    period_end: datetime

    def seconds_left(self, now: datetime) -> int:
        return max(1, int((self.period_end - now).total_seconds() + 0.999))


def period_bounds(period_kind: str, now: datetime) -> tuple[str, datetime]:
    """The period's key (``2026-11`` or ``2026-11-22``) and the instant it ends."""
    now = now.astimezone(UTC)
    if period_kind == "daily":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        end = datetime.fromordinal(start.toordinal() + 1).replace(tzinfo=UTC)
        return start.strftime("%Y-%m-%d"), end
    if now.month == 12:
        end = datetime(now.year + 1, 1, 1, tzinfo=UTC)
    else:
        end = datetime(now.year, now.month + 1, 1, tzinfo=UTC)
    return now.strftime("%Y-%m"), end


def _insert_period_row(session: Session, *, org_id: int, period: str) -> None:
    dialect = session.get_bind().dialect.name
    values = {"org_id": org_id, "period": period, "used": 0}
    if dialect == "postgresql":
        session.execute(postgresql.insert(QuotaUsage).values(**values).on_conflict_do_nothing())
    else:
        session.execute(sqlite.insert(QuotaUsage).values(**values).on_conflict_do_nothing())


def consume(*, session: Session, org_id: int, now: datetime | None = None) -> QuotaState:
    """Take one unit of the organisation's quota, or raise QuotaExceeded (429).

    The caller commits; use a session of its own so that refused calls still count.
    """
    moment = now or datetime.now(UTC)
    org = session.get(Organisation, org_id)
    if org is None:  # an account always has an organisation; be safe anyway
        raise QuotaExceeded(QUOTA_SPENT, retry_after_seconds=3600)
    period, end = period_bounds(org.quota_period, moment)
    _insert_period_row(session, org_id=org_id, period=period)
    quota = (
        select(col(Organisation.request_quota))
        .where(col(Organisation.id) == org_id)
        .scalar_subquery()
    )
    used = session.execute(
        update(QuotaUsage)
        .where(
            col(QuotaUsage.org_id) == org_id,
            col(QuotaUsage.period) == period,
            col(QuotaUsage.used) < quota,
        )
        .values(used=col(QuotaUsage.used) + 1)
        .returning(col(QuotaUsage.used))
    ).scalar_one_or_none()
    if used is None:
        state = QuotaState(limit=org.request_quota, remaining=0, period_end=end)
        raise QuotaExceeded(QUOTA_SPENT, retry_after_seconds=state.seconds_left(moment))
    return QuotaState(limit=org.request_quota, remaining=org.request_quota - used, period_end=end)


def remaining(*, session: Session, org_id: int, now: datetime | None = None) -> int:
    """Units left this period, without taking one."""
    moment = now or datetime.now(UTC)
    org = session.get(Organisation, org_id)
    if org is None:
        return 0
    period, _ = period_bounds(org.quota_period, moment)
    usage = session.get(QuotaUsage, (org_id, period))
    return max(0, org.request_quota - (usage.used if usage else 0))

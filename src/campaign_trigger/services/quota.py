"""The API-trigger request quota: one unit per create, cancel, list or report call.

Counting is atomic under concurrency on SQLite and PostgreSQL: one statement takes a
unit or takes nothing, an upsert of the period's row: ``INSERT ... SELECT ..., 1 WHERE
quota >= 1 ON CONFLICT DO UPDATE SET used = used + 1 WHERE used < quota RETURNING
used`` (the quota read in the statement itself). The statement is built once per
dialect; the API reads the organisation's :class:`Allowance` with the caller's identity
(``services/auth.py``), so that a unit costs that one statement more.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache

from sqlalchemy import Insert, Integer, String, bindparam, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col

from campaign_trigger.errors import QuotaExceeded
from campaign_trigger.store.models import Organisation, QuotaUsage

QUOTA_SPENT = "The API Trigger request quota is spent for this period"


@dataclass(frozen=True)
class Allowance:
    """An organisation's quota: units per period, and the period's kind."""

    limit: int
    period_kind: str


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


@cache
def _take_statement(dialect_name: str) -> Insert:
    """The upsert of :func:`_take_unit` for one dialect; the organisation and the period
    are bound at execution (``unit_org``, ``unit_period``)."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    org_id = bindparam("unit_org", type_=Integer)
    quota = (
        select(col(Organisation.request_quota))
        .where(col(Organisation.id) == org_id)
        .scalar_subquery()
    )
    period = bindparam("unit_period", type_=String)
    first = select(org_id, period, literal(1)).where(quota >= 1)
    table = QuotaUsage.__table__  # type: ignore[attr-defined]
    statement: Insert = (
        dialect.insert(table)
        .from_select(["org_id", "period", "used"], first)
        .on_conflict_do_update(
            index_elements=[table.c.org_id, table.c.period],
            set_={"used": table.c.used + 1},
            where=table.c.used < quota,
        )
        .returning(table.c.used)
    )
    return statement


def _take_unit(session: Session, *, org_id: int, period: str) -> int | None:
    """One unit of the period taken (the units used now), or None when none is left."""
    connection = session.connection()
    statement = _take_statement(connection.dialect.name)
    used: int | None = connection.execute(
        statement, {"unit_org": org_id, "unit_period": period}
    ).scalar_one_or_none()
    return used


def allowance(*, session: Session, org_id: int) -> Allowance | None:
    """The organisation's quota, or None if there is no such organisation."""
    org = session.get(Organisation, org_id)
    return Allowance(limit=org.request_quota, period_kind=org.quota_period) if org else None


def consume(
    *, session: Session, org_id: int, now: datetime | None = None, known: Allowance | None = None
) -> QuotaState:
    """Take one unit of the organisation's quota, or raise QuotaExceeded (429).

    ``known``: the organisation's allowance as the caller read it (with its identity),
    else read here. The caller commits; use a session of its own so that refused calls
    still count.
    """
    moment = now or datetime.now(UTC)
    org = known or allowance(session=session, org_id=org_id)
    if org is None:  # an account always has an organisation; be safe anyway
        raise QuotaExceeded(QUOTA_SPENT, retry_after_seconds=3600)
    period, end = period_bounds(org.period_kind, moment)
    used = _take_unit(session, org_id=org_id, period=period)
    if used is None:
        state = QuotaState(limit=org.limit, remaining=0, period_end=end)
        raise QuotaExceeded(QUOTA_SPENT, retry_after_seconds=state.seconds_left(moment))
    return QuotaState(limit=org.limit, remaining=org.limit - used, period_end=end)


def remaining(*, session: Session, org_id: int, now: datetime | None = None) -> int:
    """Units left this period, without taking one."""
    moment = now or datetime.now(UTC)
    org = session.get(Organisation, org_id)
    if org is None:
        return 0
    period, _ = period_bounds(org.quota_period, moment)
    usage = session.get(QuotaUsage, (org_id, period))
    return max(0, org.request_quota - (usage.used if usage else 0))

"""Report files: one CSV per app of the campaign, from the request's outcome rows.

Columns exactly ``app_id,campaign_id,user_id,device_id,sent_at,request_id,channel,
error_message``; ``sent_at`` ISO 8601 UTC (``2026-11-22T05:39:33.123456Z``); lines
end with a line feed. Every cell that a spreadsheet would read as a formula (leading
``=``, ``+``, ``-``, ``@``, tab, carriage return or line feed) is prefixed with ``'``,
and every cell holding a line break, a comma or a quote is quoted, so that no value
can start a row or a cell of its own. Rows come in the order of the request's
messages (then device id), however the answers arrived.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import ColumnElement, String, case, func, literal, select, type_coerce, update
from sqlalchemy.orm import Mapped
from sqlmodel import Session, col

from campaign_trigger.config import Settings
from campaign_trigger.services import request_states
from campaign_trigger.store.files import get_storage, report_key
from campaign_trigger.store.models import Outcome, Request, RequestState

COLUMNS: Final = (
    "app_id",
    "campaign_id",
    "user_id",
    "device_id",
    "sent_at",
    "request_id",
    "channel",
    "error_message",
)
_FORMULA_PREFIXES: Final = ("=", "+", "-", "@", "\t", "\r", "\n")
_FETCH: Final = 20_000


def neutralise(cell: str) -> str:
    """Keep a cell from being evaluated as a formula by spreadsheet software."""
    return "'" + cell if cell.startswith(_FORMULA_PREFIXES) else cell


@dataclass(slots=True)
class ReportSummary:
    """What the report says, for artifacts and logs (counts only)."""

    report_paths: list[str] = field(default_factory=list)
    per_app: dict[str, Counter[str]] = field(default_factory=dict)

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.per_app.values():
            total.update(counts)
        return total


class _Lines:
    """Where a ``csv.writer`` puts its rows: a list (``write`` is its C ``append``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.write = self.lines.append


def _cell(value: Mapped[str]) -> ColumnElement[str]:
    """:func:`neutralise`, by the database."""
    starts = func.substr(value, 1, 1).in_(_FORMULA_PREFIXES)
    return case((starts, literal("'", String()) + value), else_=value)


def _sent_at_cell(dialect: str) -> ColumnElement[str]:
    """``sent_at`` in ISO 8601 UTC with microseconds (``2026-11-22T05:39:33.123456Z``), by
    the database ("" for none)."""
    text: ColumnElement[str]
    if dialect == "postgresql":
        text = func.to_char(
            func.timezone("UTC", col(Outcome.sent_at)), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'
        )
    else:  # SQLite keeps UTCDateTime as naive UTC text: 2026-11-22 05:39:33.123456
        text = func.replace(type_coerce(col(Outcome.sent_at), String()), " ", "T") + "Z"
    return func.coalesce(text, "")


def _write_app_report(
    session: Session, settings: Settings, *, request_id: str, campaign_id: str, app_id: str
) -> Counter[str]:
    counts: Counter[str] = Counter()
    storage = get_storage(settings)
    key = report_key(request_id, app_id)
    connection = session.connection()
    # Every cell is made by the database, in the report's form (neutralised, sent_at in
    # ISO 8601 UTC): Python only quotes them (csv, in C). Converting a row's values here
    # was half of a report's CPU. yield_per on the statement, not the connection: set on
    # the connection it stays (PostgreSQL then declared a server-side cursor for the
    # session's next UPDATE).
    result = connection.execute(
        select(
            literal(neutralise(app_id), String()),
            literal(neutralise(campaign_id), String()),
            _cell(col(Outcome.user_id)),
            _cell(col(Outcome.device_id)),
            _sent_at_cell(connection.dialect.name),
            literal(neutralise(request_id), String()),
            type_coerce(col(Outcome.channel), String()),
            col(Outcome.error_message),
        )
        .where(col(Outcome.request_id) == request_id, col(Outcome.app_id) == app_id)
        .order_by(col(Outcome.row_no), col(Outcome.device_id))
        .execution_options(yield_per=_FETCH)
    )
    # Not rewritten in place: a retried or taken-over run, or the settle sweep, writes a
    # report again while its link may be downloading it.
    with storage.replace(key) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        text.write(",".join(COLUMNS) + "\n")
        for batch in result.partitions(_FETCH):
            # Rows end with CRLF, so that the writer quotes a cell holding a lone carriage
            # return too (with LF alone it wrote it bare, and a spreadsheet read it as the
            # start of a new row); written ending in LF.
            rows = _Lines()
            csv.writer(rows, lineterminator="\r\n").writerows(batch)
            text.write("".join([line[:-2] + "\n" for line in rows.lines]))
            counts.update([row[7] for row in batch])
        text.flush()
        text.detach()
    return counts


def write_reports(
    *, session: Session, settings: Settings, request_id: str, campaign_id: str, app_ids: list[str]
) -> ReportSummary:
    """Write every app's report file; returns their keys and the counts per app."""
    summary = ReportSummary()
    for app_id in app_ids:
        summary.per_app[app_id] = _write_app_report(
            session, settings, request_id=request_id, campaign_id=campaign_id, app_id=app_id
        )
        summary.report_paths.append(report_key(request_id, app_id))
    return summary


def mark_processed(*, session: Session, request_id: str, report_paths: list[str]) -> None:
    """The request is processed: its reports are these files (the caller commits). The
    first time, its completion webhooks are queued in the same transaction."""
    session.execute(
        update(Request)
        .where(col(Request.id) == request_id)
        .values(processed_at=datetime.now(UTC), report_paths=report_paths)
    )
    request_states.set_state(session=session, request_id=request_id, state=RequestState.processed)

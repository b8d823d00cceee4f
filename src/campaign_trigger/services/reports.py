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

from sqlalchemy import DateTime, String, select, type_coerce, update
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


class _LineFeedRows:
    """The target of a ``csv.writer`` that ends rows with CRLF, written ending in LF.

    The writer quotes a cell when it holds a character of its line terminator: with
    CRLF, a lone carriage return inside a value is quoted too (with LF alone, it was
    written bare, and a spreadsheet read it as the start of a new row). The writer
    calls ``write`` once per row, so the terminator is always the last two characters.
    """

    def __init__(self, text: io.TextIOBase) -> None:
        self._text = text

    def write(self, row: str) -> int:
        return self._text.write(row[:-2] + "\n")


def iso_utc(moment: datetime | None) -> str:
    """ISO 8601 in UTC; a naive ``moment`` is UTC already (SQLite's stored form)."""
    if moment is None:
        return ""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


def _write_app_report(
    session: Session, settings: Settings, *, request_id: str, campaign_id: str, app_id: str
) -> Counter[str]:
    counts: Counter[str] = Counter()
    storage = get_storage(settings)
    key = report_key(request_id, app_id)
    campaign_cell = neutralise(campaign_id)
    request_cell = neutralise(request_id)
    app_cell = neutralise(app_id)
    with storage.open(key, "wb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        writer = csv.writer(_LineFeedRows(text), lineterminator="\r\n")
        writer.writerow(COLUMNS)
        # Core rows, the stored forms: no ORM loading, no enum or UTC conversion per row
        # (they were 40 % of a report's CPU); iso_utc takes SQLite's naive UTC values.
        # yield_per on the statement, not the connection: set on the connection it stays
        # (PostgreSQL then declared a server-side cursor for the session's next UPDATE).
        result = session.connection().execute(
            select(
                col(Outcome.user_id),
                col(Outcome.device_id),
                type_coerce(col(Outcome.sent_at), DateTime()),
                type_coerce(col(Outcome.channel), String()),
                col(Outcome.error_message),
            )
            .where(col(Outcome.request_id) == request_id, col(Outcome.app_id) == app_id)
            .order_by(col(Outcome.row_no), col(Outcome.device_id))
            .execution_options(yield_per=_FETCH)
        )
        for batch in result.partitions(_FETCH):
            writer.writerows(
                (
                    app_cell,
                    campaign_cell,
                    neutralise(user),
                    neutralise(device),
                    iso_utc(sent),
                    request_cell,
                    channel,
                    error,
                )
                for user, device, sent, channel, error in batch
            )
            counts.update(row[4] for row in batch)
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

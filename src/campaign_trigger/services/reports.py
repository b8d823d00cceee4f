"""Report files: one CSV per app of the campaign, from the request's outcome rows.

Columns exactly ``app_id,campaign_id,user_id,device_id,sent_at,request_id,channel,
error_message``; ``sent_at`` ISO 8601 UTC (``2026-11-22T05:39:33.123456Z``); every
cell that a spreadsheet would read as a formula (leading ``=``, ``+``, ``-``, ``@``,
tab or carriage return) is prefixed with ``'``. Rows come in chunk order, so the
report follows the order of the request's messages.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import func, select, update
from sqlmodel import col

from campaign_trigger.config import Settings
from campaign_trigger.store.db import session_scope
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
_FORMULA_PREFIXES: Final = ("=", "+", "-", "@", "\t", "\r")
_FETCH: Final = 20_000


def neutralise(cell: str) -> str:
    """Keep a cell from being evaluated as a formula by spreadsheet software."""
    return "'" + cell if cell.startswith(_FORMULA_PREFIXES) else cell


def iso_utc(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
    settings: Settings, *, request_id: str, campaign_id: str, app_id: str
) -> Counter[str]:
    counts: Counter[str] = Counter()
    storage = get_storage(settings)
    key = report_key(request_id, app_id)
    campaign_cell = neutralise(campaign_id)
    request_cell = neutralise(request_id)
    app_cell = neutralise(app_id)
    with session_scope() as session, storage.open(key, "wb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(COLUMNS)
        result = session.execute(
            select(
                col(Outcome.user_id),
                col(Outcome.device_id),
                col(Outcome.sent_at),
                col(Outcome.channel),
                col(Outcome.error_message),
            )
            .where(col(Outcome.request_id) == request_id, col(Outcome.app_id) == app_id)
            .order_by(col(Outcome.chunk_no), col(Outcome.id))
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
                    str(channel),
                    error,
                )
                for user, device, sent, channel, error in batch
            )
            counts.update(row[4] for row in batch)
        text.flush()
        text.detach()
    return counts


def write_reports(
    settings: Settings, *, request_id: str, campaign_id: str, app_ids: list[str]
) -> ReportSummary:
    """Write every app's report file; returns their keys and the counts per app."""
    summary = ReportSummary()
    for app_id in app_ids:
        summary.per_app[app_id] = _write_app_report(
            settings, request_id=request_id, campaign_id=campaign_id, app_id=app_id
        )
        summary.report_paths.append(report_key(request_id, app_id))
    return summary


def mark_processed(*, request_id: str, report_paths: list[str]) -> None:
    with session_scope() as session:
        session.execute(
            update(Request)
            .where(col(Request.id) == request_id)
            .values(
                state=RequestState.processed,
                processed_at=datetime.now(UTC),
                report_paths=report_paths,
            )
        )


def outcome_counts(request_id: str) -> Counter[str]:
    with session_scope() as session:
        rows = session.execute(
            select(col(Outcome.error_message), func.count())
            .where(col(Outcome.request_id) == request_id)
            .group_by(col(Outcome.error_message))
        ).all()
    return Counter({error: int(count) for error, count in rows})

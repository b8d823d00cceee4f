"""Maintenance flows, deployed with cron schedules in ``prefect.yaml`` and served by
``campaign-trigger runner``: ``purge-files``, ``reconcile``, ``settle-in-progress``."""

from __future__ import annotations

from typing import Any

from prefect import flow
from pydantic import Field

from campaign_trigger.config import get_settings
from campaign_trigger.tasks import maintenance


@flow(
    name="purge-files",
    description="Delete uploads and report files of ended requests older than the retention "
    "period (CT_REPORT_RETENTION_DAYS unless given), and a day on what a create left "
    "when its process died before storing the request.",
    persist_result=False,
)
def purge_files(
    older_than_days: int | None = Field(
        default=None, gt=0, description="Retention in days; empty: CT_REPORT_RETENTION_DAYS."
    ),
) -> dict[str, int]:
    """Delete expired files; returns how many were deleted and kept."""
    days = older_than_days or get_settings().report_retention_days
    summary = maintenance.purge_expired_files(days)
    return {
        "deleted": summary.deleted,
        "kept_for_open_requests": summary.kept_for_open_requests,
        "abandoned": summary.abandoned,
    }


@flow(
    name="reconcile",
    description="Schedule accepted requests still in the outbox, and correct requests whose "
    "database state lags behind their delivery run's final state.",
    persist_result=False,
)
async def reconcile() -> dict[str, Any]:
    """Drain the outbox, then correct the mirrored states."""
    created = await maintenance.schedule_outbox()
    corrected = await maintenance.correct_mirrored_states()
    return {"runs_created": created, "corrected": corrected}


@flow(
    name="settle-in-progress",
    description="Report rows still 'In progress' of requests that ended long ago become "
    "FPErrPushFailed; their report files are written again.",
    persist_result=False,
)
def settle_in_progress(
    older_than_minutes: int = Field(
        default=60, gt=0, description="Only requests created longer ago than this."
    ),
) -> dict[str, Any]:
    """Settle stale In progress rows; returns how many rows and which requests."""
    summary = maintenance.settle_stale_outcomes(older_than_minutes)
    return {"rows": summary.rows, "requests": summary.requests}


__all__ = ["purge_files", "reconcile", "settle_in_progress"]

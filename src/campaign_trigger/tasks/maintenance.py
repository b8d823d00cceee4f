"""The maintenance deployments' tasks (``flows/maintenance.py``): each opens a session
and runs a housekeeping service (``services/housekeeping``, ``services/scheduling``)."""

from __future__ import annotations

from datetime import datetime

from prefect import get_client, get_run_logger, task

from campaign_trigger.config import get_settings
from campaign_trigger.services import housekeeping, scheduling
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage


@task(name="purge expired files", persist_result=False)
def purge_expired_files(
    older_than_days: int, now: datetime | None = None
) -> housekeeping.PurgeSummary:
    """Delete the files of ended requests last written more than ``older_than_days`` ago,
    and those of creates that never stored their request (``housekeeping``)."""
    with session_scope() as session:
        summary = housekeeping.delete_expired_files(
            session=session,
            storage=get_storage(get_settings()),
            older_than_days=older_than_days,
            now=now,
        )
    get_run_logger().info(
        "purged %d files: %d older than %d days, %d of creates that never stored their "
        "request; kept %d of requests not yet over",
        summary.deleted,
        summary.deleted - summary.abandoned,
        older_than_days,
        summary.abandoned,
        summary.kept_for_open_requests,
    )
    return summary


@task(name="schedule the outbox", persist_result=False)
async def schedule_outbox() -> int:
    """Create the flow runs of accepted requests that have none yet."""
    with session_scope() as session:
        created = await scheduling.drain_outbox(session=session)
    get_run_logger().info("outbox: %d delivery runs created", created)
    return created


@task(name="correct mirrored states", persist_result=False)
async def correct_mirrored_states() -> dict[str, int]:
    """Align each open request's mirrored state with its flow run's final state."""
    with session_scope() as session:
        async with get_client() as client:
            checked, counts = await housekeeping.correct_mirrors(session=session, client=client)
    get_run_logger().info(
        "mirrors checked: %d open requests, %d corrected %s",
        checked,
        sum(counts.values()),
        dict(counts),
    )
    return dict(counts)


@task(name="settle stale outcomes", persist_result=False)
def settle_stale_outcomes(
    older_than_minutes: int, now: datetime | None = None
) -> housekeeping.SettleSummary:
    """Report rows still In progress of requests that ended: FPErrPushFailed, reports redone."""
    with session_scope() as session:
        summary = housekeeping.fail_stale_in_progress(
            session=session,
            settings=get_settings(),
            older_than_minutes=older_than_minutes,
            now=now,
        )
    get_run_logger().info(
        "settled %d report rows still %r in %d requests",
        summary.rows,
        housekeeping.IN_PROGRESS,
        len(summary.requests),
    )
    return summary

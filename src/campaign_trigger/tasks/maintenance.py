"""Housekeeping tasks behind the maintenance deployments (``flows/maintenance.py``).

* :func:`purge_expired_files`: uploads and report files older than the retention
  period, of requests that are over (processed, cancelled, failed) or unknown.
  Files of a request still waiting or running are kept, however old.
* :func:`drain_outbox` and :func:`correct_mirrors`: accepted requests without a
  flow run get one; requests whose database mirror lags behind their flow run's
  final state are corrected (Prefect's state wins).
* :func:`settle_in_progress`: report rows still ``In progress`` long after their
  request ended become ``FPErrPushFailed``, and the request's report files are
  written again.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from prefect import get_client, get_run_logger, task
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import StateType
from sqlalchemy import update
from sqlmodel import col, select

from campaign_trigger.config import get_settings
from campaign_trigger.services import reports, scheduling
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import Storage, get_storage
from campaign_trigger.store.models import Campaign, CampaignApp, Outcome, Request, RequestState

IN_PROGRESS = "In progress"
SETTLED_AS = "FPErrPushFailed"
OVER = (RequestState.processed, RequestState.canceled, RequestState.failed)
PAGE = 200  # the Prefect server's largest page of flow runs


@dataclass(frozen=True)
class PurgeSummary:
    deleted: int
    kept_for_open_requests: int


def _modified(info: dict[str, Any]) -> datetime | None:
    """A file's last modification time from an fsspec ``info`` (local, S3, GCS, memory)."""
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(name)
        if isinstance(value, int | float):
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, str):
            try:
                moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None


def _request_of(key: str) -> str | None:
    """``uploads/<id>.csv`` and ``reports/<id>/<app>.csv`` -> ``<id>``."""
    parts = key.split("/")
    if len(parts) == 2 and parts[0] == "uploads" and parts[1].endswith(".csv"):
        return parts[1].removesuffix(".csv")
    if len(parts) == 3 and parts[0] == "reports":
        return parts[1]
    return None


def _old_files(storage: Storage, *, cutoff: datetime) -> dict[str, list[str]]:
    """Request id -> keys of its files last modified before ``cutoff``."""
    found: dict[str, list[str]] = defaultdict(list)
    root = storage.root.rstrip("/") + "/"
    for folder in ("uploads", "reports"):
        base = storage.path(folder)
        if not storage.fs.exists(base):
            continue
        for path, info in storage.fs.find(base, detail=True).items():
            key = str(path).removeprefix(root)
            request_id = _request_of(key)
            modified = _modified(info)
            if request_id is not None and modified is not None and modified < cutoff:
                found[request_id].append(key)
    return found


def _states(request_ids: list[str]) -> dict[str, RequestState]:
    states: dict[str, RequestState] = {}
    with session_scope() as session:
        for start in range(0, len(request_ids), 500):
            rows = session.exec(
                select(Request.id, Request.state).where(
                    col(Request.id).in_(request_ids[start : start + 500])
                )
            ).all()
            states.update({rid: RequestState(state) for rid, state in rows})
    return states


@task(name="purge-expired-files", persist_result=False)
def purge_expired_files(older_than_days: int, now: datetime | None = None) -> PurgeSummary:
    """Delete the files of ended requests last written more than ``older_than_days`` ago."""
    storage = get_storage(get_settings())
    cutoff = (now or datetime.now(UTC)) - timedelta(days=older_than_days)
    old = _old_files(storage, cutoff=cutoff)
    states = _states(list(old))
    deleted = kept = 0
    for request_id, keys in old.items():
        state = states.get(request_id)
        if state is not None and state not in OVER:
            kept += len(keys)
            continue
        for key in keys:
            storage.delete(key)
            deleted += 1
    get_run_logger().info(
        "purged %d files older than %d days; kept %d of requests not yet over",
        deleted,
        older_than_days,
        kept,
    )
    return PurgeSummary(deleted=deleted, kept_for_open_requests=kept)


@task(name="drain-outbox", persist_result=False)
async def drain_outbox() -> int:
    """Create the flow runs of accepted requests that have none yet."""
    created = await scheduling.drain_outbox()
    get_run_logger().info("outbox: %d delivery runs created", created)
    return created


def _open_requests() -> dict[str, tuple[str, RequestState, bool]]:
    """Flow run id -> (request id, mirrored state, has reports) of requests not yet over."""
    with session_scope() as session:
        rows = session.exec(
            select(Request.flow_run_id, Request.id, Request.state, Request.report_paths)
            .where(col(Request.flow_run_id).is_not(None))
            .where(col(Request.state).in_([RequestState.scheduled, RequestState.running]))
        ).all()
    return {str(run): (rid, RequestState(state), bool(paths)) for run, rid, state, paths in rows}


def _mirror_for(state: StateType, *, has_reports: bool) -> RequestState | None:
    """The mirror a final run state calls for; None when the flow's own writes decide.

    Non-final states are left alone: the delivery flow moves its request from
    scheduled to running itself, atomically against a cancel.
    """
    if state in (StateType.CANCELLED, StateType.CANCELLING):
        return RequestState.canceled
    if state in (StateType.FAILED, StateType.CRASHED):
        return RequestState.failed
    if state == StateType.COMPLETED and has_reports:
        return RequestState.processed
    return None


def _apply(corrections: dict[str, tuple[RequestState, RequestState]]) -> None:
    with session_scope() as session:
        for request_id, (seen, wanted) in corrections.items():
            session.execute(
                update(Request)
                .where(col(Request.id) == request_id, col(Request.state) == seen)
                .values(state=wanted)
            )


@task(name="correct-mirrors", persist_result=False)
async def correct_mirrors() -> dict[str, int]:
    """Align each open request's mirrored state with its flow run's final state."""
    open_requests = _open_requests()
    run_ids = list(open_requests)
    corrections: dict[str, tuple[RequestState, RequestState]] = {}
    async with get_client() as client:
        for start in range(0, len(run_ids), PAGE):
            ids = [UUID(run_id) for run_id in run_ids[start : start + PAGE]]
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=PAGE
            )
            for run in runs:
                request_id, seen, has_reports = open_requests[str(run.id)]
                if run.state is None:
                    continue
                wanted = _mirror_for(run.state.type, has_reports=has_reports)
                if wanted is not None and wanted != seen:
                    corrections[request_id] = (seen, wanted)
    _apply(corrections)
    counts: dict[str, int] = defaultdict(int)
    for _seen, wanted in corrections.values():
        counts[wanted.value] += 1
    get_run_logger().info(
        "mirrors checked: %d open requests, %d corrected %s",
        len(open_requests),
        len(corrections),
        dict(counts),
    )
    return dict(counts)


@dataclass(frozen=True)
class SettleSummary:
    rows: int
    requests: list[str]


def _unsettled(cutoff: datetime) -> list[tuple[str, str, RequestState]]:
    """(request, campaign, state) of ended requests with report rows still In progress."""
    with session_scope() as session:
        rows = session.exec(
            select(Request.id, Request.campaign_id, Request.state)
            .where(col(Request.state).in_(OVER))
            .where(col(Request.requested_at) < cutoff)
            .where(
                col(Request.id).in_(
                    select(Outcome.request_id).where(col(Outcome.error_message) == IN_PROGRESS)
                )
            )
        ).all()
    return [(rid, campaign, RequestState(state)) for rid, campaign, state in rows]


def _settle(request_id: str) -> int:
    with session_scope() as session:
        result = session.execute(
            update(Outcome)
            .where(col(Outcome.request_id) == request_id)
            .where(col(Outcome.error_message) == IN_PROGRESS)
            .values(error_message=SETTLED_AS)
        )
        return int(getattr(result, "rowcount", 0) or 0)


def _app_ids(campaign_id: str) -> list[str]:
    with session_scope() as session:
        campaign = session.get(Campaign, campaign_id)
        if campaign is None:
            return []
        return list(
            session.exec(
                select(CampaignApp.app_id).where(CampaignApp.campaign_id == campaign_id)
            ).all()
        )


@task(name="settle-in-progress", persist_result=False)
def settle_in_progress(older_than_minutes: int, now: datetime | None = None) -> SettleSummary:
    """Report rows still In progress of requests that ended: FPErrPushFailed, reports redone."""
    settings = get_settings()
    cutoff = (now or datetime.now(UTC)) - timedelta(minutes=older_than_minutes)
    settled_rows = 0
    settled: list[str] = []
    for request_id, campaign_id, state in _unsettled(cutoff):
        settled_rows += _settle(request_id)
        if state == RequestState.processed:  # its report files are handed out: redo them
            reports.write_reports(
                settings,
                request_id=request_id,
                campaign_id=campaign_id,
                app_ids=_app_ids(campaign_id),
            )
        settled.append(request_id)
    get_run_logger().info(
        "settled %d report rows still %r in %d requests", settled_rows, IN_PROGRESS, len(settled)
    )
    return SettleSummary(rows=settled_rows, requests=settled)


__all__ = [
    "IN_PROGRESS",
    "PurgeSummary",
    "SettleSummary",
    "correct_mirrors",
    "drain_outbox",
    "purge_expired_files",
    "settle_in_progress",
]

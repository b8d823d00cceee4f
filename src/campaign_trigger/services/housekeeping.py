"""Housekeeping behind the maintenance deployments: old files, lagging mirrors, stale rows.

* :func:`delete_expired_files`: uploads, message files and report files older than
  the retention period, of requests that are over (processed, cancelled, failed) or
  unknown. Files of a request still waiting or running are kept, however old. And,
  sooner, what a create left when its process died before storing the request (an
  upload or a message file named by a request id that was never stored), once
  ``ABANDONED_AFTER`` old: a part of a user's file, not kept for the retention period.
* :func:`correct_mirrors`: requests whose database mirror lags behind their flow
  run's final state are corrected (Prefect's state wins; ``request_states``).
* :func:`fail_stale_in_progress`: report rows still ``In progress`` long after their
  request ended become ``FPErrPushFailed``, and the request's report files are
  written again.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from uuid import UUID

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from sqlalchemy import update
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.services import reports, request_states
from campaign_trigger.store.files import ABANDONED_AFTER, Storage
from campaign_trigger.store.models import CampaignApp, Outcome, Request, RequestState

IN_PROGRESS: Final = "In progress"
SETTLED_AS: Final = "FPErrPushFailed"
OVER: Final = (RequestState.processed, RequestState.canceled, RequestState.failed)
PAGE: Final = 200  # the Prefect server's largest page of flow runs
_REQUEST_FILE: Final = re.compile(r"[0-9a-f]{32}\.(csv|arrow)")


@dataclass(frozen=True)
class PurgeSummary:
    deleted: int
    kept_for_open_requests: int
    abandoned: int  # of ``deleted``: files of creates whose request was never stored


@dataclass(frozen=True)
class SettleSummary:
    rows: int
    requests: list[str]


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


def request_of_key(key: str) -> str | None:
    """``uploads/<id>.csv``, ``messages/<id>.arrow``, ``reports/<id>/<app>.csv`` -> ``<id>``."""
    parts = key.split("/")
    if len(parts) == 2 and parts[0] == "uploads" and parts[1].endswith(".csv"):
        return parts[1].removesuffix(".csv")
    if len(parts) == 2 and parts[0] == "messages" and parts[1].endswith(".arrow"):
        return parts[1].removesuffix(".arrow")
    if len(parts) == 3 and parts[0] == "reports":
        return parts[1]
    return None


def _old_files(storage: Storage, *, cutoff: datetime) -> dict[str, list[tuple[str, datetime]]]:
    """Request id -> keys of its files last modified before ``cutoff``, each with that time."""
    found: dict[str, list[tuple[str, datetime]]] = defaultdict(list)
    root = storage.root.rstrip("/") + "/"
    for folder in ("uploads", "messages", "reports"):
        base = storage.path(folder)
        if not storage.fs.exists(base):
            continue
        for path, info in storage.fs.find(base, detail=True).items():
            key = str(path).removeprefix(root)
            request_id = request_of_key(key)
            modified = _modified(info)
            if request_id is not None and modified is not None and modified < cutoff:
                found[request_id].append((key, modified))
    return found


def _written_by_a_create(key: str) -> bool:
    """An upload or a message file named by a request id (``store.models.new_id``): what
    a create writes before it stores its request. Not a report (written for a stored
    request only), nor a file an operator put under ``uploads/`` for send-batch."""
    name = key.rsplit("/", 1)[-1]
    return key.startswith(("uploads/", "messages/")) and bool(_REQUEST_FILE.fullmatch(name))


def _states(session: Session, request_ids: list[str]) -> dict[str, RequestState]:
    states: dict[str, RequestState] = {}
    for start in range(0, len(request_ids), 500):
        rows = session.exec(
            select(Request.id, Request.state).where(
                col(Request.id).in_(request_ids[start : start + 500])
            )
        ).all()
        states.update({rid: RequestState(state) for rid, state in rows})
    return states


def delete_expired_files(
    *, session: Session, storage: Storage, older_than_days: int, now: datetime | None = None
) -> PurgeSummary:
    """Delete the files of ended requests last written more than ``older_than_days`` ago,
    and those of creates that never stored their request once ``ABANDONED_AFTER`` old."""
    now = now or datetime.now(UTC)
    expired = now - timedelta(days=older_than_days)
    old = _old_files(storage, cutoff=max(expired, now - ABANDONED_AFTER))
    states = _states(session, list(old))
    deleted = kept = abandoned = 0
    for request_id, files in old.items():
        state = states.get(request_id)
        for key, modified in files:
            if state is None and _written_by_a_create(key):
                abandoned += 1
            elif modified >= expired:
                continue
            elif state is not None and state not in OVER:
                kept += 1
                continue
            storage.delete(key)
            deleted += 1
    return PurgeSummary(deleted=deleted, kept_for_open_requests=kept, abandoned=abandoned)


def _open_requests(session: Session) -> dict[str, tuple[str, RequestState, bool]]:
    """Flow run id -> (request id, mirrored state, has reports) of requests not yet over."""
    rows = session.exec(
        select(Request.flow_run_id, Request.id, Request.state, Request.report_paths)
        .where(col(Request.flow_run_id).is_not(None))
        .where(col(Request.state).in_([RequestState.scheduled, RequestState.running]))
    ).all()
    return {str(run): (rid, RequestState(state), bool(paths)) for run, rid, state, paths in rows}


async def correct_mirrors(*, session: Session, client: PrefectClient) -> tuple[int, Counter[str]]:
    """Align each open request's mirror with its flow run's final state; returns how many
    were checked and the corrections per state."""
    open_requests = _open_requests(session)
    session.commit()  # no transaction held across the Prefect calls
    run_ids = list(open_requests)
    counts: Counter[str] = Counter()
    for start in range(0, len(run_ids), PAGE):
        ids = [UUID(run_id) for run_id in run_ids[start : start + PAGE]]
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=PAGE
        )
        for run in runs:
            request_id, seen, has_reports = open_requests[str(run.id)]
            if run.state is None or not run.state.is_final():
                continue  # the flow moves its request to running itself
            wanted = request_states.mirror_of(run.state, has_reports=has_reports)
            if wanted is not None and wanted != seen:
                request_states.set_state(
                    session=session, request_id=request_id, state=wanted, only_from=[seen]
                )
                counts[wanted.value] += 1
    session.commit()
    return len(open_requests), counts


def _unsettled(session: Session, cutoff: datetime) -> list[tuple[str, str, RequestState]]:
    """(request, campaign, state) of ended requests with report rows still In progress."""
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


def fail_stale_in_progress(
    *,
    session: Session,
    settings: Settings,
    older_than_minutes: int,
    now: datetime | None = None,
) -> SettleSummary:
    """Report rows still In progress of requests that ended: FPErrPushFailed, reports redone."""
    cutoff = (now or datetime.now(UTC)) - timedelta(minutes=older_than_minutes)
    settled_rows = 0
    settled: list[str] = []
    for request_id, campaign_id, state in _unsettled(session, cutoff):
        result: Any = session.execute(
            update(Outcome)
            .where(col(Outcome.request_id) == request_id)
            .where(col(Outcome.error_message) == IN_PROGRESS)
            .values(error_message=SETTLED_AS)
        )
        settled_rows += int(getattr(result, "rowcount", 0) or 0)
        if state == RequestState.processed:  # its report files are handed out: redo them
            app_ids = list(
                session.exec(
                    select(CampaignApp.app_id).where(CampaignApp.campaign_id == campaign_id)
                ).all()
            )
            reports.write_reports(
                session=session,
                settings=settings,
                request_id=request_id,
                campaign_id=campaign_id,
                app_ids=app_ids,
            )
        settled.append(request_id)
    return SettleSummary(rows=settled_rows, requests=settled)

"""Delivering one chunk of a request, exactly once.

A chunk's outcome rows, its in-app inbox rows and its ``DeliveredChunk`` row are
written in ONE transaction; a chunk with a ``DeliveredChunk`` row is never sent
again (re-runs after a crash, retries, manual re-runs). A crash between sending
and recording re-sends that one chunk: the window is one chunk, never a request.
Tokens that come back unregistered are marked on their devices by the provider
itself, as the answer arrives (``delivery.registry.DatabaseEvents``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from sqlalchemy import Table, insert, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import col

from campaign_trigger.config import Settings
from campaign_trigger.delivery import open_provider
from campaign_trigger.delivery.base import PushMessage, PushProvider, PushResult
from campaign_trigger.delivery.inapp import InboxEntry, publish_inapp
from campaign_trigger.services import audience
from campaign_trigger.services.render import render_column
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import (
    Channel,
    DeliveredChunk,
    Outcome,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChunkJob:
    """Everything a chunk needs besides its messages (small, picklable)."""

    request_id: str
    campaign_id: str
    channel: Channel
    title: str
    body: str
    apps: tuple[audience.AppTarget, ...]
    chunk_no: int
    chunk_size: int
    send_at: datetime


@dataclass(slots=True)
class ChunkResult:
    chunk_no: int
    skipped: bool
    outcomes: Counter[str] = field(default_factory=Counter)


def recorded_chunks(request_id: str) -> set[int]:
    with session_scope() as session:
        rows = session.execute(
            select(col(DeliveredChunk.chunk_no)).where(col(DeliveredChunk.request_id) == request_id)
        ).all()
    return {row[0] for row in rows}


async def _send_push(
    settings: Settings,
    job: ChunkJob,
    targets: Sequence[audience.Target],
    titles: list[str],
    bodies: list[str],
) -> dict[int, PushResult]:
    """Send every target still to send, app by app; target index -> result."""
    results: dict[int, PushResult] = {}
    data = {"request_id": job.request_id, "campaign_id": job.campaign_id}
    for app in job.apps:
        messages = [
            PushMessage(key=i, token=t.token, title=titles[t.row], body=bodies[t.row], data=data)
            for i, t in enumerate(targets)
            if t.app_id == app.app_id and not t.error_message
        ]
        if not messages:
            continue
        provider = _provider(settings, app)
        await sleep_until(job.send_at)  # everything is ready: never send before send_at
        for result in await provider.send_many(messages):
            results[result.key] = result
        if provider.auth_failed:
            logger.warning("provider refused our credentials for an app of the campaign")
            _providers.pop(_provider_key(settings, app), None)
            await provider.aclose()
    return results


# Providers stay open across chunks and runs of this process (connections and access
# tokens reused); keyed by event loop too, since their connections belong to one loop.
_providers: dict[tuple[int, str, str, str, str], PushProvider] = {}


def _provider_key(settings: Settings, app: audience.AppTarget) -> tuple[int, str, str, str, str]:
    loop = id(asyncio.get_running_loop())
    return (loop, app.platform.value, app.app_id, settings.fcm_base_url, settings.apns_base_url)


def _provider(settings: Settings, app: audience.AppTarget) -> PushProvider:
    key = _provider_key(settings, app)
    for stale in [k for k in _providers if k[0] != key[0]]:  # a finished event loop's
        _providers.pop(stale, None)
    provider = _providers.get(key)
    if provider is None:
        provider = _providers[key] = open_provider(
            app.platform, settings=settings, app_id=app.app_id
        )
    return provider


async def close_providers() -> None:
    """Close this loop's pooled providers (at worker shutdown)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _providers if k[0] == loop]:
        provider = _providers.pop(key)
        await provider.aclose()


async def sleep_until(moment: datetime) -> None:
    delay = (moment - datetime.now(UTC)).total_seconds()
    if delay > 0:
        await asyncio.sleep(delay)


_OUTCOME_TABLE: Table = Outcome.__table__  # type: ignore[attr-defined]


def _record(
    job: ChunkJob,
    rows: list[dict[str, Any]],
    inbox: list[InboxEntry],
    *,
    now: datetime,
) -> bool:
    """Outcomes + inbox + DeliveredChunk in one transaction; False if already recorded."""
    try:
        with session_scope() as session:
            session.execute(
                insert(DeliveredChunk).values(
                    request_id=job.request_id, chunk_no=job.chunk_no, recorded_at=datetime.now(UTC)
                )
            )
            if rows:  # Core executemany: no per-row ORM bookkeeping
                session.connection().execute(insert(_OUTCOME_TABLE), rows)
            if inbox:
                publish_inapp(session=session, rows=inbox, published_at=now)
    except IntegrityError:
        return False
    return True


async def deliver_chunk(settings: Settings, job: ChunkJob, messages: pa.Table) -> ChunkResult:
    """Render, send and record one chunk (``messages`` is the request's whole table)."""
    if job.chunk_no in await asyncio.to_thread(recorded_chunks, job.request_id):
        return ChunkResult(chunk_no=job.chunk_no, skipped=True)
    chunk = messages.slice(job.chunk_no * job.chunk_size, job.chunk_size)
    users: list[str] = chunk.column(audience.USER_COLUMN).to_pylist()
    targets = await asyncio.to_thread(
        audience.resolve_targets, users=users, apps=job.apps, channel=job.channel
    )
    titles = render_column(job.title, chunk)
    bodies = render_column(job.body, chunk)
    now = datetime.now(UTC)
    inbox: list[InboxEntry] = []
    if job.channel == Channel.push:
        results = await _send_push(settings, job, targets, titles, bodies)
    else:
        await sleep_until(job.send_at)
        now = datetime.now(UTC)
        results = {}
        for i, t in enumerate(targets):
            if not t.error_message:
                results[i] = PushResult(key=i, error_message="", sent_at=now, unregistered_at=None)
                inbox.append(
                    InboxEntry(
                        app_id=t.app_id,
                        device_id=t.device_id,
                        user_id=t.user_id,
                        request_id=job.request_id,
                        campaign_id=job.campaign_id,
                        title=titles[t.row],
                        body=bodies[t.row],
                    )
                )
    rows: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for i, t in enumerate(targets):
        result = results.get(i)
        error = t.error_message if result is None else result.error_message
        counts[error] += 1
        rows.append(
            {
                "request_id": job.request_id,
                "chunk_no": job.chunk_no,
                "app_id": t.app_id,
                "user_id": t.user_id,
                "device_id": t.device_id,
                "channel": job.channel,
                "sent_at": result.sent_at if result is not None and not error else None,
                "error_message": error,
            }
        )
    if not await asyncio.to_thread(_record, job, rows, inbox, now=now):
        logger.warning("chunk %d was recorded by another run meanwhile", job.chunk_no)
        return ChunkResult(chunk_no=job.chunk_no, skipped=True)
    return ChunkResult(chunk_no=job.chunk_no, skipped=False, outcomes=counts)

"""Delivering one chunk of a request: render, send, record — each message exactly once.

A chunk's report rows are written to the outcome log (``services/outcome_log.py``)
as the provider answers, a message's row committed before its concurrency slot is
given back. A re-run of an interrupted chunk skips every (app, row, device) already
recorded and sends the rest, so after a crash only the messages that were in flight
may go twice — at most ``delivery_concurrency`` per app — and every push carries a
collapse identity of (request, message row, device) (:func:`collapse_id`): a second
copy replaces the first on the device instead of adding a notification.

What an answer teaches outlives the chunk: a token that came back unregistered is
marked on its device, and refused credentials flag the app (``services/devices``), in
the transaction that records the answer. A chunk's database work all goes through the
one session its task hands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
from sqlmodel import Session

from campaign_trigger import metrics
from campaign_trigger.config import Settings
from campaign_trigger.delivery.base import (
    FP_ERR_PUSH_FAILED,
    PushMessage,
    PushOptions,
    PushProvider,
    PushResult,
)
from campaign_trigger.delivery.providers import (
    ProviderFor,
    pooled_provider,
    provider_lease,
    release_provider,
)
from campaign_trigger.services import app_credentials, audience, devices, outcome_log
from campaign_trigger.services.inbox import InboxEntry
from campaign_trigger.services.message_file import USER_FIELD
from campaign_trigger.services.render import compile_template, render_column
from campaign_trigger.store.db import in_thread
from campaign_trigger.store.models import Channel, Platform

logger = logging.getLogger(__name__)


class SendsInterrupted(Exception):
    """A chunk's sends broke off part way (an answer that could not be recorded, a
    provider call that failed): messages in flight may have reached the provider without
    their rows, so the chunk is not tried again by its task's retries, where they would
    go twice. Its run fails; what was recorded stays recorded. A step that fails before
    its first send is retried (``tasks/delivery.py``)."""


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
    data: tuple[tuple[str, str], ...] = ()  # the campaign's data: (key, template) pairs
    image: str | None = None  # the campaign's image URL template
    options: PushOptions = field(default_factory=PushOptions)

    @property
    def first_row(self) -> int:
        return self.chunk_no * self.chunk_size


@dataclass(slots=True)
class ChunkResult:
    chunk_no: int
    skipped: bool
    outcomes: Counter[str] = field(default_factory=Counter)
    resumed: int = 0  # rows found already recorded by an interrupted run


def collapse_id(request_id: str, row: int, device_id: str) -> str:
    """The message's identity on its device: 32 hex characters (APNs allows 64 bytes)."""
    key = f"{request_id}\x00{row}\x00{device_id}".encode()
    return hashlib.blake2b(key, digest_size=16).hexdigest()


async def sleep_until(moment: datetime) -> None:
    delay = (moment - datetime.now(UTC)).total_seconds()
    if delay > 0:
        await asyncio.sleep(delay)


async def prepare_until(provider: PushProvider, moment: datetime) -> None:
    """Let the provider ready its first send (:meth:`PushProvider.prepare`: a token, a
    connection) in the time left before ``moment``, never past it; not at all for a chunk
    already due (its sends make what they need, as they would have)."""
    left = (moment - datetime.now(UTC)).total_seconds()
    if left > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(provider.prepare(), left)


def _row(
    job: ChunkJob, target: audience.Target, *, error: str, sent_at: datetime | None
) -> outcome_log.OutcomeRow:
    return (
        job.request_id,
        job.first_row + target.row,
        target.app_id,
        target.user_id,
        target.device_id,
        job.channel.value,
        sent_at if not error else None,
        error,
    )


def _unregistered(app_id: str, token: str, moment: datetime) -> outcome_log.Write:
    return lambda s: devices.record_unregistered(session=s, app_id=app_id, tokens={token: moment})


def _auth_refused(app_id: str) -> outcome_log.Write:
    return lambda s: devices.flag_auth_failed(session=s, app_id=app_id)


@dataclass(frozen=True, slots=True)
class Rendered:
    """A chunk's rendered templates: one value per message row."""

    titles: list[str]
    bodies: list[str]
    data: list[dict[str, str]]  # per row: ours and the campaign's data
    images: list[str]


def render_chunk(job: ChunkJob, chunk: pa.Table) -> Rendered:
    """Title, body, data values and image of every row (a constant template once)."""
    ours = {"request_id": job.request_id, "campaign_id": job.campaign_id}
    rows = chunk.num_rows
    if any(compile_template(template).names for _, template in job.data):
        columns = {key: render_column(template, chunk) for key, template in job.data}
        data = [ours | {key: values[row] for key, values in columns.items()} for row in range(rows)]
    else:  # the same for every row: one mapping, encoded once per chunk
        data = [ours | dict(job.data)] * rows
    return Rendered(
        titles=render_column(job.title, chunk),
        bodies=render_column(job.body, chunk),
        data=data,
        images=render_column(job.image, chunk) if job.image else [""] * rows,
    )


def push_message(
    job: ChunkJob, rendered: Rendered, *, key: int, row: int, token: str, device_id: str
) -> PushMessage:
    """Row ``row`` of the chunk as the push to one device (the provider builds its payload)."""
    return PushMessage(
        key=key,
        token=token,
        title=rendered.titles[row],
        body=rendered.bodies[row],
        data=rendered.data[row],
        collapse_id=collapse_id(job.request_id, job.first_row + row, device_id),
        image=rendered.images[row],
        options=job.options,
    )


async def _send_push(
    session: Session,
    settings: Settings,
    job: ChunkJob,
    targets: Sequence[audience.Target],
    chunk: pa.Table,
    recorder: outcome_log.OutcomeRecorder,
    counts: Counter[str],
    provider_for: ProviderFor,
) -> None:
    """Send every target still to send, app by app, recording each answer."""
    rendered = render_chunk(job, chunk)

    async def record(result: PushResult) -> None:
        target = targets[result.key]
        counts[result.error_message] += 1
        if result.unregistered_at is not None:
            recorder.also(_unregistered(target.app_id, target.token, result.unregistered_at))
        await recorder.record(_row(job, target, error=result.error_message, sent_at=result.sent_at))

    for app in job.apps:
        messages = [
            push_message(job, rendered, key=i, row=t.row, token=t.token, device_id=t.device_id)
            for i, t in enumerate(targets)
            if t.app_id == app.app_id
        ]
        if not messages:
            continue
        # Read at every chunk: a rotation of the app's credentials applies from the next one.
        credentials = await in_thread(
            app_credentials.provider_credentials,
            session=session,
            settings=settings,
            app_id=app.app_id,
            platform=app.platform,
        )
        provider_name = metrics.provider_of(app.platform)
        if credentials is None:
            await sleep_until(job.send_at)
            logger.error("app %s has no usable push credentials: not sent", app.app_id)
            for message in messages:
                await record(PushResult(message.key, FP_ERR_PUSH_FAILED, None, None))
            metrics.count_messages(provider_name, {FP_ERR_PUSH_FAILED: len(messages)})
            continue
        async with provider_lease(settings, app, credentials, provider_for) as provider:
            await prepare_until(provider, job.send_at)
            await sleep_until(job.send_at)  # everything is ready: never send before send_at
            try:
                results = await provider.send_many(messages, on_result=record)
            except Exception as exc:  # every answer was recorded once send_many returns
                # The error's type only: its text may quote what was sent or recorded (a
                # database error's statement), and this message is the run's state in the UI.
                raise SendsInterrupted(
                    f"chunk {job.chunk_no + 1} of request {job.request_id}: its sends to "
                    f"app {app.app_id} broke off ({type(exc).__name__}); not tried again, so "
                    "that no message in flight goes twice"
                ) from exc
            metrics.count_messages(provider_name, Counter(r.error_message for r in results))
            _log_failures(job, app, provider, results)
            if provider.auth_failed:
                logger.warning("provider refused the credentials of app %s", app.app_id)
                recorder.also(_auth_refused(app.app_id))
                await release_provider(settings, app)


def _log_failures(
    job: ChunkJob, app: audience.AppTarget, provider: PushProvider, results: Sequence[PushResult]
) -> None:
    """One line per app and chunk whose pushes failed: where they went and why, so that a
    provider nobody can reach (a sandbox not started, a wrong URL) is not a silent
    column of ``FPErrPushFailed``."""
    reasons = Counter(
        r.reason or "no reason given" for r in results if r.error_message == FP_ERR_PUSH_FAILED
    )
    if not reasons:
        return
    why = "; ".join(f"{reason} ({count})" for reason, count in reasons.most_common(3))
    logger.warning(
        "request %s chunk %d app %s: %d of %d pushes failed (%s) at %s %s: %s",
        job.request_id,
        job.chunk_no,
        app.app_id,
        sum(reasons.values()),
        len(results),
        FP_ERR_PUSH_FAILED,
        "FCM" if app.platform == Platform.android else "APNs",
        provider.endpoint,
        why,
    )


async def _publish_inapp(
    session: Session,
    job: ChunkJob,
    targets: Sequence[audience.Target],
    chunk: pa.Table,
    counts: Counter[str],
) -> bool:
    """Publish the chunk's in-app messages with its report rows, in one transaction."""
    rendered = render_chunk(job, chunk)
    await sleep_until(job.send_at)
    now = datetime.now(UTC)
    rows = [_row(job, t, error=t.error_message, sent_at=now) for t in targets]
    inbox = [
        InboxEntry(
            app_id=t.app_id,
            device_id=t.device_id,
            user_id=t.user_id,
            request_id=job.request_id,
            campaign_id=job.campaign_id,
            title=rendered.titles[t.row],
            body=rendered.bodies[t.row],
            data={key: rendered.data[t.row][key] for key, _ in job.data},
            image=rendered.images[t.row] or None,
        )
        for t in targets
        if not t.error_message
    ]
    counts.update(t.error_message for t in targets)
    published: bool = await in_thread(
        outcome_log.record_whole_chunk,
        session=session,
        request_id=job.request_id,
        chunk_no=job.chunk_no,
        rows=rows,
        inbox=inbox,
        published_at=now,
        ttl_seconds=job.options.ttl_seconds,
    )
    if published:
        metrics.count_messages("inapp", Counter(t.error_message for t in targets))
    return published


async def process_chunk(
    *,
    session: Session,
    settings: Settings,
    job: ChunkJob,
    chunk: pa.Table,
    provider_for: ProviderFor = pooled_provider,
) -> ChunkResult:
    """Render, send and record one chunk (``chunk``: its rows of the message file).

    ``provider_for`` gives the push provider of an app (this process's pooled one).
    """
    if await in_thread(
        outcome_log.chunk_recorded,
        session=session,
        request_id=job.request_id,
        chunk_no=job.chunk_no,
    ):
        return ChunkResult(chunk_no=job.chunk_no, skipped=True)
    users: list[str] = chunk.column(USER_FIELD).to_pylist()
    targets = await in_thread(
        audience.resolve_targets,
        session=session,
        users=users,
        apps=job.apps,
        channel=job.channel,
    )
    counts: Counter[str] = Counter()
    if job.channel == Channel.inapp:
        if not await _publish_inapp(session, job, targets, chunk, counts):
            logger.warning("chunk %d was recorded by another run meanwhile", job.chunk_no)
            return ChunkResult(chunk_no=job.chunk_no, skipped=True)
        return ChunkResult(chunk_no=job.chunk_no, skipped=False, outcomes=counts)

    done = await in_thread(
        outcome_log.recorded_targets,
        session=session,
        request_id=job.request_id,
        app_ids=[app.app_id for app in job.apps],
        first_row=job.first_row,
        end_row=job.first_row + chunk.num_rows,
    )
    todo = [t for t in targets if not done.has(t.app_id, job.first_row + t.row, t.device_id)]
    resumed = len(targets) - len(todo)
    recorder = outcome_log.OutcomeRecorder(
        session=session, request_id=job.request_id, chunk_no=job.chunk_no
    )
    try:
        known = [t for t in todo if t.error_message]
        counts.update(t.error_message for t in known)
        platforms = {app.app_id: app.platform for app in job.apps}
        metrics.count_outcomes_by_provider(
            (metrics.provider_of(platforms[t.app_id]), t.error_message) for t in known
        )
        await recorder.record_all(
            [_row(job, t, error=t.error_message, sent_at=None) for t in known]
        )
        to_send = [t for t in todo if not t.error_message]
        await _send_push(session, settings, job, to_send, chunk, recorder, counts, provider_for)
        await recorder.finish()
    except BaseException:
        await recorder.abandon()
        raise
    return ChunkResult(chunk_no=job.chunk_no, skipped=False, outcomes=counts, resumed=resumed)

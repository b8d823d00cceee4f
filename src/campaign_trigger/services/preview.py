"""Previewing a request: what a checked trigger call would send, computed as delivery would.

:func:`scratch_storage` is where a preview writes: a private temporary folder under
``CT_HOME/previews`` (a local disk, never the shared storage), removed with everything
in it when the preview ends, whatever happens (after a crash, by a later preview). A CSV
upload to preview is streamed there, the ingest writes its message file there, and
nothing remains in storage.

:func:`describe` reads the message file chunk by chunk (memory holds one chunk, as a
delivery worker's does) and runs the delivery's own steps on it: the delivery plan
(``services/delivery_run.py``), the audience (``services/audience.py``), the rendering
and the push messages (``services/delivering.py``) and the providers' payload builders
(``delivery/payload.py``), so a preview cannot drift from what is sent.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlmodel import Session

from campaign_trigger.config import Settings
from campaign_trigger.delivery.base import FP_ERR_JSON_MARSHALLING
from campaign_trigger.delivery.payload import PayloadError, apns_body, fcm_payload
from campaign_trigger.schemas.preview import (
    PREVIEW_ROWS,
    AppAudience,
    PayloadProblem,
    PreviewMessage,
    RenderedMessage,
    TriggerPreview,
)
from campaign_trigger.services import audience
from campaign_trigger.services.delivering import ChunkJob, Rendered, push_message, render_chunk
from campaign_trigger.services.delivery_run import delivery_plan
from campaign_trigger.services.message_file import USER_FIELD, iter_chunks
from campaign_trigger.store.files import ABANDONED_AFTER, Storage, messages_key
from campaign_trigger.store.models import Campaign, Channel, MessageSource, Platform, Request
from campaign_trigger.store.private import private_dir

PREVIEWS_DIR = "previews"


@contextmanager
def scratch_storage(settings: Settings) -> Iterator[Storage]:
    """A storage in a fresh private temporary folder, deleted on exit.

    A folder left behind by a process killed mid-preview is deleted by a later preview
    once it is :data:`ABANDONED_AFTER` old (no preview lasts that long).
    """
    parent = (settings.home / PREVIEWS_DIR).resolve()
    private_dir(parent)
    _delete_abandoned(parent, now=time.time())
    with tempfile.TemporaryDirectory(dir=parent, prefix="preview-") as folder:
        yield Storage(folder)


def _delete_abandoned(parent: Path, *, now: float) -> None:
    for folder in parent.glob("preview-*"):
        with contextlib.suppress(FileNotFoundError):  # another process got there first
            if now - folder.stat().st_mtime > ABANDONED_AFTER.total_seconds():
                shutil.rmtree(folder, ignore_errors=True)


def _payload(platform: Platform, job: ChunkJob, rendered: Rendered, row: int) -> bytes:
    """Row ``row``'s payload for the provider of ``platform`` (no device token), or
    PayloadError as delivery would meet it."""
    message = push_message(job, rendered, key=row, row=row, token="", device_id="")
    return fcm_payload(message) if platform == Platform.android else apns_body(message)


def _refusal(exc: PayloadError) -> str:
    return f"{FP_ERR_JSON_MARSHALLING}: {exc}"


def _shown(platform: Platform, job: ChunkJob, rendered: Rendered, row: int) -> RenderedMessage:
    """Row ``row`` as the provider of ``platform`` would receive it."""
    try:
        payload = _payload(platform, job, rendered, row)
    except PayloadError as exc:
        title, body = rendered.titles[row], rendered.bodies[row]
        return RenderedMessage(title=title, body=body, error=_refusal(exc))
    document = json.loads(payload)
    if platform == Platform.android:
        alert = document.get("notification", {})
    else:
        alert = document["aps"].get("alert", {})
    return RenderedMessage(
        title=alert.get("title"),
        body=alert.get("body"),
        payload=document,
        payload_bytes=len(payload),
    )


class _Tally:
    """The preview's counts, built chunk by chunk."""

    def __init__(self, apps: tuple[audience.AppTarget, ...]) -> None:
        self.apps = apps
        self.devices: Counter[str] = Counter()
        self.to_send: Counter[str] = Counter()
        self.not_sent: dict[str, Counter[str]] = {app.app_id: Counter() for app in apps}
        self.without_device = 0
        self.messages: list[PreviewMessage] = []
        self.problems: list[PayloadProblem] = []
        self.problem_count = 0

    def add_targets(self, targets: list[audience.Target]) -> None:
        no_device: set[int] = set()
        for target in targets:
            if target.error_message == audience.NO_DEVICE:
                no_device.add(target.row)
                continue
            self.devices[target.app_id] += 1
            if target.error_message:
                self.not_sent[target.app_id][target.error_message] += 1
            else:
                self.to_send[target.app_id] += 1
        self.without_device += len(no_device)

    def add_problem(self, *, row: int, user_id: str, platform: str, error: str) -> None:
        self.problem_count += 1
        if len(self.problems) < PREVIEW_ROWS:
            self.problems.append(
                PayloadProblem(row=row, user_id=user_id, platform=platform, error=error)
            )

    def app_audiences(self) -> list[AppAudience]:
        return [
            AppAudience(
                app_id=app.app_id,
                platform=app.platform.value,
                devices=self.devices[app.app_id],
                to_send=self.to_send[app.app_id],
                not_sent=dict(sorted(self.not_sent[app.app_id].items())),
            )
            for app in self.apps
        ]

    def per_platform(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for app in self.apps:
            counts[app.platform.value] += self.to_send[app.app_id]
        return dict(sorted(counts.items()))


def _preview_message(
    channel: Channel,
    platforms: list[Platform],
    job: ChunkJob,
    rendered: Rendered,
    *,
    row: int,
    number: int,
    user_id: str,
) -> PreviewMessage:
    shown: dict[str, RenderedMessage]
    if channel == Channel.inapp:
        shown = {"inapp": RenderedMessage(title=rendered.titles[row], body=rendered.bodies[row])}
    else:
        shown = {p.value: _shown(p, job, rendered, row) for p in platforms}
    return PreviewMessage(row=number, user_id=user_id, rendered=shown)


def describe(
    *, session: Session, files: Storage, request: Request, campaign: Campaign
) -> TriggerPreview:
    """The preview of ``request`` (checked, not stored), its message file in ``files``,
    read once, one chunk in memory at a time."""
    plan = delivery_plan(session=session, request=request, campaign=campaign)
    platforms = sorted({app.platform for app in plan.apps}, key=lambda p: p.value)
    tally = _Tally(plan.apps)
    key = messages_key(request.id)
    # where the caller finds the message: a CSV's row as its reading errors number it
    # (the header is row 1, services/ingest.py), a JSON list's place (1 for the first)
    first = 2 if request.source == MessageSource.csv else 1
    for chunk_no, chunk in enumerate(iter_chunks(storage=files, key=key)):
        job = plan.job(chunk_no)
        users: list[str] = chunk.column(USER_FIELD).to_pylist()
        tally.add_targets(
            audience.resolve_targets(
                session=session, users=users, apps=plan.apps, channel=plan.channel
            )
        )
        rendered = render_chunk(job, chunk)
        for row, user_id in enumerate(users):
            number = job.first_row + row + first
            if len(tally.messages) < PREVIEW_ROWS:
                tally.messages.append(
                    _preview_message(
                        plan.channel,
                        platforms,
                        job,
                        rendered,
                        row=row,
                        number=number,
                        user_id=user_id,
                    )
                )
            for platform in platforms if plan.channel == Channel.push else ():
                try:
                    _payload(platform, job, rendered, row)
                except PayloadError as exc:
                    tally.add_problem(
                        row=number, user_id=user_id, platform=platform.value, error=_refusal(exc)
                    )
    return TriggerPreview(
        campaign_id=campaign.id,
        channel=campaign.channel.value,
        send_at=int(request.send_at.timestamp()),
        message_count=request.message_count,
        users_without_device=tally.without_device,
        apps=tally.app_audiences(),
        devices_per_platform=tally.per_platform(),
        messages=tally.messages,
        payload_error_count=tally.problem_count,
        payload_errors=tally.problems,
    )

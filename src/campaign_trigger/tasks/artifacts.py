"""What runs show in the Prefect UI: a delivery's progress bar and summary table, and a
dry run's preview."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from uuid import UUID

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    aupdate_progress_artifact,
)

from campaign_trigger.config import get_settings
from campaign_trigger.schemas.preview import TriggerPreview
from campaign_trigger.services.reports import ReportSummary
from campaign_trigger.services.signing import signed_url

logger = logging.getLogger("campaign_trigger.tasks.artifacts")


class Progress:
    """A run's progress artifact, made and updated off the delivery's path: neither
    making one nor :meth:`show` waits for the Prefect API; updates are at least
    ``EVERY_SECONDS`` apart, each with the latest count; :meth:`close` shows the last count
    at once and waits for it.

    Chunks of a fast provider end every ~0.4 s: an update per chunk was a
    ``PATCH /artifacts`` the Prefect server answered twice a second during the chunks.
    Making the artifact before the first chunk held that chunk back by the creation's
    round trip (30-70 ms, docs/benchmarks.md)."""

    EVERY_SECONDS = 1.0

    def __init__(self, *, chunk_count: int, done: int) -> None:
        """The progress bar at ``done`` of ``chunk_count``, made in the background in the
        caller's run."""
        self.chunk_count = chunk_count
        self.done = self.shown = done
        self._made: asyncio.Task[UUID | None] = asyncio.create_task(self._make())
        self._sending: asyncio.Task[None] | None = None
        self._sent_at = time.monotonic()
        self._closing = asyncio.Event()

    async def _make(self) -> UUID | None:
        try:
            return await acreate_progress_artifact(
                progress=_percent(self.shown, self.chunk_count),
                description=_description(self.shown, self.chunk_count),
            )
        except Exception as exc:  # a progress bar never fails a delivery
            logger.warning("progress not shown: %r", exc)
            return None

    def show(self, done: int) -> None:
        self.done = done
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send())

    async def _send(self) -> None:
        artifact_id = await self._made
        while artifact_id is not None and self.shown != self.done:
            wait = self._sent_at + self.EVERY_SECONDS - time.monotonic()
            if wait > 0 and not self._closing.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), timeout=wait)
            done = self.done
            try:
                await aupdate_progress_artifact(
                    artifact_id,
                    progress=_percent(done, self.chunk_count),
                    description=_description(done, self.chunk_count),
                )
            except Exception as exc:  # a progress bar never fails a delivery
                logger.warning("progress not shown: %r", exc)
                return
            self.shown, self._sent_at = done, time.monotonic()

    async def close(self) -> None:
        self._closing.set()
        await self._made
        if self._sending is not None:
            await self._sending
        if self.shown != self.done:
            await self._send()


def _description(done: int, chunk_count: int) -> str:
    return f"Chunks delivered ({done}/{chunk_count})"


def _percent(done: int, total: int) -> float:
    return 100.0 if total == 0 else round(100.0 * done / total, 1)


def _outcome(name: str) -> str:
    return name or "sent"


def summary_markdown(*, request_id: str, summary: ReportSummary) -> str:
    """Counts per outcome and per app, with links to the report files."""
    settings = get_settings()
    outcomes = sorted(summary.totals(), key=lambda name: (name != "", name))
    apps = sorted(summary.per_app)
    lines = [
        f"# Delivery of request `{request_id}`",
        "",
        "| outcome | " + " | ".join(f"`{app}`" for app in apps) + " | total |",
        "|---|" + "---:|" * (len(apps) + 1),
    ]
    totals = summary.totals()
    for name in outcomes:
        cells = [str(summary.per_app[app].get(name, 0)) for app in apps]
        lines.append(f"| {_outcome(name)} | " + " | ".join(cells) + f" | {totals[name]} |")
    all_rows = [str(sum(summary.per_app[app].values())) for app in apps]
    lines.append("| **rows** | " + " | ".join(all_rows) + f" | {sum(totals.values())} |")
    lines += ["", "Reports (links valid one hour from the end of the run):", ""]
    for key in summary.report_paths:
        lines.append(f"- [{key}]({signed_url(settings=settings, path=f'/files/{key}')})")
    return "\n".join(lines)


async def publish_summary(*, request_id: str, summary: ReportSummary) -> None:
    """The summary table, once the report marked the request processed: not shown, it
    must not fail the run of a request delivered, its report written and announced."""
    try:
        await acreate_markdown_artifact(
            markdown=summary_markdown(request_id=request_id, summary=summary),
            key=None,
            description="Delivery summary",
        )
    except Exception as exc:
        logger.warning("summary not shown: %r", exc)


def _cell(text: str | None) -> str:
    """Text for a markdown table cell (pipes and line breaks would break the table)."""
    if text is None:
        return "—"
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def preview_markdown(preview: TriggerPreview) -> str:
    """A dry run's preview: counts, devices per app, the first messages, payload problems.

    Messages are named by their row, not their user (user ids stay out of the UI, as in
    the refusal artifact); their rendered texts are what the preview is for."""
    send_at = datetime.fromtimestamp(preview.send_at, UTC).isoformat()
    lines = [
        f"# Dry run of campaign `{preview.campaign_id}`",
        "",
        "Nothing was stored, scheduled or sent.",
        "",
        "| | |",
        "|---|---:|",
        f"| messages | {preview.message_count} |",
        f"| users without a device | {preview.users_without_device} |",
        f"| payloads a provider would refuse | {preview.payload_error_count} |",
        f"| send at | {send_at} |",
        "",
        "## Devices per app",
        "",
        "| app | platform | devices | to send | not sent |",
        "|---|---|---:|---:|---|",
    ]
    for app in preview.apps:
        not_sent = ", ".join(f"{name}: {count}" for name, count in app.not_sent.items())
        lines.append(
            f"| `{app.app_id}` | {app.platform} | {app.devices} | {app.to_send} | "
            f"{not_sent or '—'} |"
        )
    lines += [
        "",
        f"## First {len(preview.messages)} messages",
        "",
        "| row | platform | title | body | payload bytes |",
        "|---:|---|---|---|---:|",
    ]
    for message in preview.messages:
        for platform, shown in message.rendered.items():
            size = shown.error or (str(shown.payload_bytes) if shown.payload_bytes else "—")
            lines.append(
                f"| {message.row} | {platform} | "
                f"{_cell(shown.title)} | {_cell(shown.body)} | {_cell(size)} |"
            )
    if preview.payload_errors:
        lines += [
            "",
            f"## Payloads a provider would refuse ({preview.payload_error_count})",
            "",
            *[f"- row {p.row} ({p.platform}): {_cell(p.error)}" for p in preview.payload_errors],
        ]
    return "\n".join(lines)

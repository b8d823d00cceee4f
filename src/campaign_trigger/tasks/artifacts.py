"""What a delivery run shows in the Prefect UI: a progress bar and a summary table."""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    aupdate_progress_artifact,
)

from campaign_trigger.config import get_settings
from campaign_trigger.services.reports import ReportSummary
from campaign_trigger.services.signing import signed_url

logger = logging.getLogger("campaign_trigger.tasks.artifacts")


class Progress:
    """A run's progress artifact, updated off the delivery's path: :meth:`show` never
    waits for the Prefect API (an update in flight is followed by one with the latest
    count when it lands); :meth:`close` waits for the last count to be shown."""

    def __init__(self, artifact_id: UUID, chunk_count: int, done: int) -> None:
        self.artifact_id, self.chunk_count = artifact_id, chunk_count
        self.done = self.shown = done
        self._sending: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, *, chunk_count: int, done: int) -> Progress:
        artifact_id = await acreate_progress_artifact(
            progress=_percent(done, chunk_count),
            description=_description(done, chunk_count),
        )
        return cls(artifact_id, chunk_count, done)

    def show(self, done: int) -> None:
        self.done = done
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send())

    async def _send(self) -> None:
        while self.shown != self.done:
            done = self.done
            try:
                await aupdate_progress_artifact(
                    self.artifact_id,
                    progress=_percent(done, self.chunk_count),
                    description=_description(done, self.chunk_count),
                )
            except Exception as exc:  # a progress bar never fails a delivery
                logger.warning("progress not shown: %r", exc)
                return
            self.shown = done

    async def close(self) -> None:
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
    await acreate_markdown_artifact(
        markdown=summary_markdown(request_id=request_id, summary=summary),
        key=None,
        description="Delivery summary",
    )

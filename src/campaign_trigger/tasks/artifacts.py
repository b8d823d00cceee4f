"""What a delivery run shows in the Prefect UI: a progress bar and a summary table."""

from __future__ import annotations

from uuid import UUID

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    aupdate_progress_artifact,
)

from campaign_trigger.config import get_settings
from campaign_trigger.services.reports import ReportSummary
from campaign_trigger.services.signing import signed_url


async def start_progress(*, chunk_count: int, done: int) -> UUID:
    return await acreate_progress_artifact(
        progress=_percent(done, chunk_count),
        description=f"Chunks delivered ({done}/{chunk_count})",
    )


async def update_progress(artifact_id: UUID, *, chunk_count: int, done: int) -> None:
    await aupdate_progress_artifact(
        artifact_id,
        progress=_percent(done, chunk_count),
        description=f"Chunks delivered ({done}/{chunk_count})",
    )


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
